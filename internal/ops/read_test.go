package ops_test

import (
	"encoding/base64"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)

	// webhook: one row in every state, one stuck, one ambiguous.
	for _, st := range ops.Statuses {
		r := row{Key: "wh-" + st, Status: st, Age: 10 * time.Minute, LeaseIn: time.Minute}
		insertRow(t, tx, r)
	}
	insertRow(t, tx, row{Key: "wh-stuck", Status: outbox.StatusDelivering, LeaseIn: -time.Minute, Age: time.Minute})
	insertRow(t, tx, row{Key: "wh-amb", Status: outbox.StatusPending, Ambiguous: true, Age: time.Minute, NextAttemptIn: time.Hour})
	// email: healthy, with a pending row scheduled for later (not a backlog).
	insertRow(t, tx, row{Key: "em-1", Connector: "email", Status: outbox.StatusDelivered, Age: time.Hour})
	insertRow(t, tx, row{Key: "em-2", Connector: "email", Age: time.Hour, NextAttemptIn: time.Hour})
	// slack: dead letters, one within the hour, one within the day, one older.
	insertRow(t, tx, row{Key: "sl-1", Connector: "slack", Status: outbox.StatusDead, Age: 2 * time.Hour, UpdatedAgo: ptr(10 * time.Minute)})
	insertRow(t, tx, row{Key: "sl-2", Connector: "slack", Status: outbox.StatusDead, Age: 5 * time.Hour})
	insertRow(t, tx, row{Key: "sl-3", Connector: "slack", Status: outbox.StatusDead, Age: 72 * time.Hour})
	// payment: a due row waiting 5 minutes: backlog.
	insertRow(t, tx, row{Key: "pay-1", Connector: "payment", Age: 5 * time.Minute, NextAttemptIn: -5 * time.Minute})
	// webhook:crm: only an old dead row: healthy.
	insertRow(t, tx, row{Key: "crm-1", Connector: "webhook:crm", Status: outbox.StatusDead, Age: 72 * time.Hour})

	rep, err := ops.Status(t.Context(), tx, base)
	require.NoError(t, err)
	require.Equal(t, ops.VerdictStuck, rep.Verdict)
	by := map[string]ops.ConnectorStatus{}
	for _, c := range rep.Connectors {
		by[c.Connector] = c
	}
	require.Len(t, by, 5)

	wh := by["webhook"]
	require.Equal(t, ops.Counts{Pending: 2, Delivering: 2, Delivered: 1, Dead: 1, Canceled: 1, AwaitingApproval: 1, Held: 1}, wh.Counts)
	require.Equal(t, 1, wh.Stuck)
	require.Equal(t, 1, wh.Ambiguous)
	require.Equal(t, 10*time.Minute, wh.OldestPendingAge)
	require.Equal(t, ops.VerdictStuck, wh.Verdict)

	require.Equal(t, ops.VerdictHealthy, by["email"].Verdict)
	require.Equal(t, time.Hour, by["email"].OldestPendingAge)
	require.Zero(t, by["email"].OldestDueWait)

	sl := by["slack"]
	require.Equal(t, 1, sl.DeadLastHour)
	require.Equal(t, 2, sl.DeadLastDay)
	require.Equal(t, 3, sl.Counts.Dead)
	require.Equal(t, ops.VerdictDead, sl.Verdict)

	require.Equal(t, ops.VerdictBacklog, by["payment"].Verdict)
	require.Equal(t, 5*time.Minute, by["payment"].OldestDueWait)

	require.Equal(t, ops.VerdictHealthy, by["webhook:crm"].Verdict)
	require.Equal(t, 1, by["webhook:crm"].Counts.Dead)
}

func TestStatusEmpty(t *testing.T) {
	t.Parallel()
	rep, err := ops.Status(t.Context(), pgtest.Tx(t), base)
	require.NoError(t, err)
	require.Equal(t, ops.VerdictHealthy, rep.Verdict)
	require.Empty(t, rep.Connectors)
}

func keysOf(in []outbox.Intent) []string {
	out := make([]string, len(in))
	for i, x := range in {
		out[i] = x.Key
	}
	return out
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	insertRow(t, tx, row{Key: "order/1/charge", Connector: "payment", Status: outbox.StatusDead, Age: 3 * time.Hour, LastError: "Card DECLINED by issuer"})
	insertRow(t, tx, row{Key: "order/1/email", Connector: "email", Status: outbox.StatusDelivered, Age: 2 * time.Hour})
	insertRow(t, tx, row{Key: "order/2/email", Connector: "email", Status: outbox.StatusPending, Age: time.Hour, OrderingKey: "customer-7"})
	insertRow(t, tx, row{Key: "order%_x", Connector: "webhook", Status: outbox.StatusHeld, Age: 30 * time.Minute, LastError: "timeout"})
	insertRow(t, tx, row{Key: "orderXYx", Connector: "webhook", Status: outbox.StatusDead, Age: 10 * time.Minute})

	cases := []struct {
		name string
		f    ops.Filter
		want []string
	}{
		{"all newest first", ops.Filter{}, []string{"orderXYx", "order%_x", "order/2/email", "order/1/email", "order/1/charge"}},
		{"status", ops.Filter{Status: []string{"dead", "held"}}, []string{"orderXYx", "order%_x", "order/1/charge"}},
		{"connector", ops.Filter{Connector: "email"}, []string{"order/2/email", "order/1/email"}},
		{"key prefix", ops.Filter{KeyPrefix: "order/1/"}, []string{"order/1/email", "order/1/charge"}},
		{"key prefix is literal", ops.Filter{KeyPrefix: "order%_"}, []string{"order%_x"}},
		{"older than", ops.Filter{OlderThan: 90 * time.Minute}, []string{"order/1/email", "order/1/charge"}},
		{"newer than", ops.Filter{NewerThan: 45 * time.Minute}, []string{"orderXYx", "order%_x"}},
		{"error contains ignores case", ops.Filter{ErrorContains: "declined"}, []string{"order/1/charge"}},
		{"ordering key", ops.Filter{OrderingKey: "customer-7"}, []string{"order/2/email"}},
		{"combined", ops.Filter{Status: []string{"dead"}, Connector: "webhook", NewerThan: time.Hour}, []string{"orderXYx"}},
		{"none", ops.Filter{Connector: "slack"}, []string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.f.Now = base
			page, err := ops.List(t.Context(), tx, c.f)
			require.NoError(t, err)
			require.Equal(t, c.want, keysOf(page.Intents))
			require.Empty(t, page.Next)
		})
	}
}

func TestListInvalid(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	for name, f := range map[string]ops.Filter{
		"status":    {Status: []string{"pending", "stuck"}},
		"older":     {OlderThan: -time.Second},
		"newer":     {NewerThan: -time.Second},
		"limit":     {Limit: -1},
		"cursor":    {After: "not a cursor!"},
		"cursor b6": {After: "e30"}, // "{}"
		// Past PostgreSQL's years (4714 BC to 294276 AD) both ways: not a database error.
		"cursor late":  {After: base64.RawURLEncoding.EncodeToString([]byte(`{"s":9224318016000,"i":5}`))},
		"cursor early": {After: base64.RawURLEncoding.EncodeToString([]byte(`{"s":-210866803201,"i":5}`))},
		"cursor no id": {After: base64.RawURLEncoding.EncodeToString([]byte(`{"s":5}`))},
		// A cursor of an older outboxd, which carried created_at as a JSON time.
		"cursor old": {After: base64.RawURLEncoding.EncodeToString([]byte(`{"c":"2026-11-30T17:00:00Z","i":5}`))},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ops.List(t.Context(), tx, f)
			require.ErrorIs(t, err, ops.ErrInvalidFilter)
		})
	}
	_, err := ops.List(t.Context(), tx, ops.Filter{Status: []string{"stuck"}})
	require.ErrorContains(t, err, `"stuck"`)
}

func TestListPagination(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	// 120 rows; pairs share a created_at so the id breaks ties.
	for i := range 120 {
		insertRow(t, tx, row{Key: fmt.Sprintf("k-%03d", i), Age: time.Duration(120-i/2*2) * time.Second})
	}
	var (
		all   []outbox.Intent
		pages int
		after string
	)
	for {
		page, err := ops.List(t.Context(), tx, ops.Filter{Limit: 50, After: after, Now: base})
		require.NoError(t, err)
		pages++
		all = append(all, page.Intents...)
		if page.Next == "" {
			break
		}
		require.Len(t, page.Intents, 50)
		after = page.Next
		require.Less(t, pages, 10)
	}
	require.Equal(t, 3, pages)
	require.Len(t, all, 120)
	seen := map[string]bool{}
	for i, in := range all {
		require.False(t, seen[in.Key], "duplicate %s", in.Key)
		seen[in.Key] = true
		if i > 0 {
			prev := all[i-1]
			require.True(t, prev.CreatedAt.After(in.CreatedAt) ||
				(prev.CreatedAt.Equal(in.CreatedAt) && prev.ID > in.ID), "not newest first at %d", i)
		}
	}
	require.Equal(t, "k-119", all[0].Key)

	// Limit defaults to 50 and is capped at 1000.
	page, err := ops.List(t.Context(), tx, ops.Filter{})
	require.NoError(t, err)
	require.Len(t, page.Intents, 50)
	page, err = ops.List(t.Context(), tx, ops.Filter{Limit: 5000})
	require.NoError(t, err)
	require.Len(t, page.Intents, 120)
}

func TestInspect(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	id := insertRow(t, pool, row{Key: "inspect-me", Status: outbox.StatusHeld, Attempts: 2, Age: time.Hour,
		LastError: "connection reset", Ambiguous: true, OrderingKey: "ok-1"})
	_, err := pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
VALUES ($1, 1, 'relay-a', $2::timestamptz, $2::timestamptz + interval '1.5 seconds', 'retry', false, '503 from receiver'),
       ($1, 2, 'relay-b', $2::timestamptz + interval '1 minute', $2::timestamptz + interval '61 seconds', 'held', true, 'connection reset')`,
		id, base.Add(-time.Hour))
	require.NoError(t, err)
	res, err := ops.Cancel(t.Context(), pool, []string{"inspect-me"}, "alice", "customer asked", base)
	require.NoError(t, err)
	require.Equal(t, []string{"inspect-me"}, res.Canceled)

	d, err := ops.Inspect(t.Context(), pool, "inspect-me")
	require.NoError(t, err)
	require.Equal(t, "inspect-me", d.Intent.Key)
	require.Equal(t, outbox.StatusCanceled, d.Intent.Status)
	require.Equal(t, "ok-1", d.Intent.OrderingKey)
	require.Equal(t, "connection reset", d.Intent.LastError)
	require.Len(t, d.Attempts, 2)
	require.Equal(t, ops.Attempt{Attempt: 1, Relay: "relay-a", StartedAt: base.Add(-time.Hour),
		FinishedAt: base.Add(-time.Hour + 1500*time.Millisecond), Duration: 1500 * time.Millisecond,
		Outcome: "retry", Error: "503 from receiver"}, normalise(d.Attempts[0]))
	require.True(t, d.Attempts[1].Ambiguous)
	require.Equal(t, "relay-b", d.Attempts[1].Relay)
	require.Len(t, d.Audit, 1)
	require.Equal(t, "cancel", d.Audit[0].Action)
	require.Equal(t, "alice", d.Audit[0].Actor)
	require.Equal(t, "customer asked", d.Audit[0].Reason)
	require.True(t, d.Audit[0].At.Equal(base))
	require.JSONEq(t, `{"from_status": "held"}`, string(d.Audit[0].Details))

	_, err = ops.Inspect(t.Context(), pool, "nope")
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

func normalise(a ops.Attempt) ops.Attempt {
	a.StartedAt, a.FinishedAt = a.StartedAt.UTC(), a.FinishedAt.UTC()
	return a
}

// A due row that waits for an earlier row of its ordering key (one waiting out its
// backoff, or awaiting approval) is not a backlog: no relay could take it, and more
// relays would not help. It used to make status say "backlog growing" (relays missing or
// too slow) while the rows waited, as designed, for time or for a person.
func TestStatusRowsWaitingForTheirOrderingKeyAreNoBacklog(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	// webhook: the key's first row retries in an hour; the second waits for it.
	insertRow(t, tx, row{Key: "k1-first", OrderingKey: "k1", Attempts: 1, Age: 10 * time.Minute, NextAttemptIn: time.Hour})
	insertRow(t, tx, row{Key: "k1-second", OrderingKey: "k1", Age: 10 * time.Minute, NextAttemptIn: -10 * time.Minute})
	// email: the key's first row awaits approval; the second waits for it.
	insertRow(t, tx, row{Key: "k2-first", Connector: "email", OrderingKey: "k2", Status: outbox.StatusAwaitingApproval, Age: 10 * time.Minute})
	insertRow(t, tx, row{Key: "k2-second", Connector: "email", OrderingKey: "k2", Age: 10 * time.Minute, NextAttemptIn: -10 * time.Minute})
	// webhook:crm: the key's first row is delivered; the second is due and nobody takes it.
	insertRow(t, tx, row{Key: "k3-first", Connector: "webhook:crm", OrderingKey: "k3", Status: outbox.StatusDelivered, Age: 10 * time.Minute})
	insertRow(t, tx, row{Key: "k3-second", Connector: "webhook:crm", OrderingKey: "k3", Age: 5 * time.Minute, NextAttemptIn: -5 * time.Minute})

	rep, err := ops.Status(t.Context(), tx, base)
	require.NoError(t, err)
	by := map[string]ops.ConnectorStatus{}
	for _, c := range rep.Connectors {
		by[c.Connector] = c
	}
	require.Equal(t, ops.VerdictHealthy, by["webhook"].Verdict, "%+v", by["webhook"])
	require.Zero(t, by["webhook"].OldestDueWait)
	require.Equal(t, 10*time.Minute, by["webhook"].OldestPendingAge)
	require.Equal(t, ops.VerdictHealthy, by["email"].Verdict, "%+v", by["email"])
	require.Equal(t, ops.VerdictBacklog, by["webhook:crm"].Verdict)
	require.Equal(t, 5*time.Minute, by["webhook:crm"].OldestDueWait)
	require.Equal(t, ops.VerdictBacklog, rep.Verdict)
}

// Plain SQL may write created_at or next_attempt_at as ±infinity (the relay claims such
// rows). PostgreSQL before 17 refuses to subtract an infinite timestamp, and status failed
// outright ("cannot subtract infinite timestamps"); a row created at -infinity is the
// oldest there can be.
func TestStatusWithInfiniteTimes(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	insertRow(t, tx, row{Key: "now", Age: time.Minute})
	for _, stmt := range []string{
		`INSERT INTO outbox (idempotency_key, connector, payload, created_at, next_attempt_at)
		 VALUES ('ancient', 'webhook', '{}', '-infinity', '-infinity')`,
		`INSERT INTO outbox (idempotency_key, connector, payload, created_at, next_attempt_at)
		 VALUES ('future', 'webhook', '{}', 'infinity', 'infinity')`,
	} {
		_, err := tx.Exec(t.Context(), stmt)
		require.NoError(t, err)
	}
	rep, err := ops.Status(t.Context(), tx, base)
	require.NoError(t, err)
	require.Len(t, rep.Connectors, 1)
	cs := rep.Connectors[0]
	require.Equal(t, 3, cs.Counts.Pending)
	require.Equal(t, time.Duration(math.MaxInt64), cs.OldestPendingAge)
	require.Equal(t, time.Duration(math.MaxInt64), cs.OldestDueWait)
	require.Equal(t, ops.VerdictBacklog, cs.Verdict)
}
