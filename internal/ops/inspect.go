package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/outbox"
)

// Detail is everything known about one intent: the row, every attempt and every
// operator action.
type Detail struct {
	Intent outbox.Intent `json:"intent"`
	// Ambiguous says the latest attempt may or may not have reached the receiver.
	Ambiguous bool `json:"ambiguous"`
	// LeaseOwner and LeaseExpiresAt name the relay delivering the row, while one is.
	LeaseOwner     string    `json:"lease_owner,omitempty"`
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
	// LeaseExpired says the lease ran out, by the database's clock: the relay died or
	// lost the database, and the row waits for a relay with its connector to put it back.
	LeaseExpired bool `json:"lease_expired,omitempty"`
	// FirstAttemptAt is when the first attempt started; zero before any.
	FirstAttemptAt time.Time `json:"first_attempt_at,omitzero"`
	// Attempts are in the order they were made.
	Attempts []Attempt `json:"attempts"`
	// Audit lists operator actions on the row, oldest first.
	Audit []AuditEntry `json:"audit"`
}

// Attempt is one delivery attempt of an intent, from outbox_attempts.
type Attempt struct {
	Attempt   int       `json:"attempt"`
	Relay     string    `json:"relay"`
	StartedAt time.Time `json:"started_at"`
	// FinishedAt is zero while the attempt has not finished.
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Duration is FinishedAt - StartedAt; zero while unfinished.
	Duration time.Duration `json:"duration"`
	// Outcome is delivered, retry, dead, held or lease_expired; empty while the attempt
	// has not finished (see [Inspect]).
	Outcome   string `json:"outcome"`
	Ambiguous bool   `json:"ambiguous"`
	Error     string `json:"error,omitempty"`
}

// AuditEntry is one operator action on an intent, from outbox_audit.
type AuditEntry struct {
	ID     int64     `json:"id"`
	Action string    `json:"action"`
	Actor  string    `json:"actor"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
	// Details depend on the action, such as {"from_status": "dead"} for a replay.
	Details json.RawMessage `json:"details"`
}

// inspectSQL reads one intent by key with the engine's columns Intent leaves out.
const inspectSQL = `
SELECT ` + outbox.IntentColumns + `, ambiguous, coalesce(lease_owner, ''), lease_expires_at, first_attempt_at,
       coalesce(status = 'delivering' AND lease_expires_at < clock_timestamp(), false)
FROM outbox WHERE idempotency_key = $1`

// attemptsSQL reads a row's attempts in order.
const attemptsSQL = `
SELECT attempt, relay_id, started_at, finished_at, outcome, ambiguous, coalesce(error, '')
FROM outbox_attempts WHERE outbox_id = $1 ORDER BY attempt, id`

// auditTrailSQL reads a row's audit trail in order.
const auditTrailSQL = `
SELECT id, action, actor, coalesce(reason, ''), at, details
FROM outbox_audit WHERE outbox_id = $1 ORDER BY id`

// Inspect returns the intent with key, its attempts and its audit trail. The attempt of
// a row being delivered is listed last, unfinished, from the row's lease: its relay
// logs it only with its outcome (or a relay, once the lease expired, as lease_expired),
// and it is the one the receiver may be acting on. The error
// wraps [outbox.ErrNotFound] when no intent has the key. The three reads are separate
// statements; pass a repeatable-read transaction as db for a single snapshot.
func Inspect(ctx context.Context, db outbox.DB, key string) (Detail, error) {
	var (
		d               Detail
		leaseExp, first pgtype.Timestamptz
	)
	in, err := outbox.ScanIntent(db.QueryRow(ctx, inspectSQL, key), &d.Ambiguous, &d.LeaseOwner, &leaseExp, &first, &d.LeaseExpired)
	if errors.Is(err, pgx.ErrNoRows) {
		return Detail{}, fmt.Errorf("%w: no intent has key %q", outbox.ErrNotFound, key)
	}
	if err != nil {
		return Detail{}, fmt.Errorf("inspect %q: %w", key, err)
	}
	d.Intent = in
	d.LeaseExpiresAt, d.FirstAttemptAt = outbox.FiniteTime(leaseExp), outbox.FiniteTime(first)

	rows, err := db.Query(ctx, attemptsSQL, in.ID)
	if err != nil {
		return Detail{}, fmt.Errorf("inspect %q: attempts: %w", key, err)
	}
	d.Attempts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var (
			a        Attempt
			finished *time.Time
		)
		err := r.Scan(&a.Attempt, &a.Relay, &a.StartedAt, &finished, &a.Outcome, &a.Ambiguous, &a.Error)
		if finished != nil {
			a.FinishedAt = *finished
			a.Duration = finished.Sub(a.StartedAt)
		}
		return a, err
	})
	if err != nil {
		return Detail{}, fmt.Errorf("inspect %q: attempts: %w", key, err)
	}
	if in.Status == outbox.StatusDelivering && (len(d.Attempts) == 0 || d.Attempts[len(d.Attempts)-1].Attempt < in.Attempts) {
		// Claimed at updated_at, which reclaim logs as its start too (relay/sql.go,
		// reclaimSQL). Once the lease has expired the receiver may or may not have acted.
		d.Attempts = append(d.Attempts, Attempt{Attempt: in.Attempts, Relay: d.LeaseOwner, StartedAt: in.UpdatedAt,
			Ambiguous: d.LeaseExpired})
	}

	rows, err = db.Query(ctx, auditTrailSQL, in.ID)
	if err != nil {
		return Detail{}, fmt.Errorf("inspect %q: audit: %w", key, err)
	}
	d.Audit, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.Action, &e.Actor, &e.Reason, &e.At, &e.Details)
		return e, err
	})
	if err != nil {
		return Detail{}, fmt.Errorf("inspect %q: audit: %w", key, err)
	}
	return d, nil
}

// credentialWords mark row headers whose values are credentials for the receiver, which
// no API token is shown and the CLI does not print: Authorization (a row's replaces a
// webhook instance's own), Proxy-Authorization and Cookie, and the headers in which
// receivers take credentials of their own (an API gateway's X-Api-Key, an Azure
// Function's X-Functions-Key, GitLab's Private-Token, X-Auth-Token). A harmless header
// a word catches is only hidden from view; it is still sent.
var credentialWords = []string{"auth", "cookie", "key", "token", "secret", "password", "session", "credential"}

// credentialHeader reports whether a row header's value is to be shown REDACTED.
func credentialHeader(name string) bool {
	name = strings.ToLower(name)
	return slices.ContainsFunc(credentialWords, func(w string) bool { return strings.Contains(name, w) })
}

// WithoutCredentials returns in with the values of its credential headers redacted.
func WithoutCredentials(in outbox.Intent) outbox.Intent {
	for name := range in.Headers {
		if credentialHeader(name) {
			h := make(map[string]string, len(in.Headers))
			for k, v := range in.Headers {
				if credentialHeader(k) {
					v = "REDACTED"
				}
				h[k] = v
			}
			in.Headers = h
			break
		}
	}
	return in
}
