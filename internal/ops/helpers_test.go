package ops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// base is the tests' clock: rows are placed relative to it.
var base = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

// db is what fixtures need of a database handle.
type db interface {
	outbox.DB
}

// row is a fixture: fields left zero get a default.
type row struct {
	Key, Connector, Status string
	Age                    time.Duration // created_at = base - Age
	UpdatedAgo             *time.Duration
	NextAttemptIn          time.Duration // next_attempt_at = base + NextAttemptIn
	LeaseOwner             string
	LeaseIn                time.Duration // lease_expires_at = base + LeaseIn (delivering only)
	LastError, OrderingKey string
	Ambiguous              bool
	Attempts               int
	Payload, Result        string
	Headers                string // a JSON object; {} when empty
}

func ptr[T any](v T) *T { return &v }

// insertRow writes r with plain SQL and returns its id.
func insertRow(t *testing.T, d db, r row) int64 {
	t.Helper()
	if r.Connector == "" {
		r.Connector = "webhook"
	}
	if r.Status == "" {
		r.Status = outbox.StatusPending
	}
	if r.Payload == "" {
		r.Payload = fmt.Sprintf(`{"key": %q}`, r.Key)
	}
	if r.Headers == "" {
		r.Headers = "{}"
	}
	updatedAgo := r.Age
	if r.UpdatedAgo != nil {
		updatedAgo = *r.UpdatedAgo
	}
	var leaseOwner, lastError, orderingKey, result *string
	var leaseExp, deliveredAt *time.Time
	if r.Status == outbox.StatusDelivering {
		owner := r.LeaseOwner
		if owner == "" {
			owner = "relay-1"
		}
		leaseOwner, leaseExp = &owner, ptr(base.Add(r.LeaseIn))
	}
	if r.Status == outbox.StatusDelivered {
		deliveredAt = ptr(base.Add(-updatedAgo))
		if r.Result == "" {
			r.Result = `{"status": 200}`
		}
	}
	if r.LastError != "" {
		lastError = &r.LastError
	}
	if r.OrderingKey != "" {
		orderingKey = &r.OrderingKey
	}
	if r.Result != "" {
		result = &r.Result
	}
	var id int64
	err := d.QueryRow(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, next_attempt_at, last_error,
                    result, ordering_key, lease_owner, lease_expires_at, ambiguous, created_at, updated_at,
                    delivered_at, headers)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
RETURNING id`,
		r.Key, r.Connector, r.Payload, r.Status, r.Attempts, base.Add(r.NextAttemptIn), lastError,
		result, orderingKey, leaseOwner, leaseExp, r.Ambiguous, base.Add(-r.Age), base.Add(-updatedAgo),
		deliveredAt, r.Headers).Scan(&id)
	require.NoError(t, err)
	return id
}

// rowState is what tests check of a row after a command.
type rowState struct {
	Status     string
	Ambiguous  bool
	LeaseOwner *string
	Payload    string
	LastError  *string
	Result     *string
	NextAt     time.Time
	Attempts   int
}

func state(t *testing.T, d db, key string) rowState {
	t.Helper()
	var s rowState
	err := d.QueryRow(t.Context(), `
SELECT status, ambiguous, lease_owner, payload::text, last_error, result::text, next_attempt_at, attempts
FROM outbox WHERE idempotency_key = $1`, key).
		Scan(&s.Status, &s.Ambiguous, &s.LeaseOwner, &s.Payload, &s.LastError, &s.Result, &s.NextAt, &s.Attempts)
	require.NoError(t, err)
	return s
}

// auditRows returns (action, actor, details) of key's audit trail.
func auditRows(t *testing.T, d db, key string) [][3]string {
	t.Helper()
	rows, err := d.Query(t.Context(), `
SELECT a.action, a.actor, a.details::text FROM outbox_audit a JOIN outbox o ON o.id = a.outbox_id
WHERE o.idempotency_key = $1 ORDER BY a.id`, key)
	require.NoError(t, err)
	defer rows.Close()
	var out [][3]string
	for rows.Next() {
		var a [3]string
		require.NoError(t, rows.Scan(&a[0], &a[1], &a[2]))
		out = append(out, a)
	}
	require.NoError(t, rows.Err())
	return out
}

func count(t *testing.T, d db, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, d.QueryRow(context.WithoutCancel(t.Context()), sql, args...).Scan(&n))
	return n
}
