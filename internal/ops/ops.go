package ops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/outbox"
)

// Sentinel errors; test for them with errors.Is.
var (
	// ErrInvalidFilter means a [Filter] or [Selection] was refused before anything was
	// read: an unknown status, a negative age, a bad cursor. The message names the field.
	ErrInvalidFilter = errors.New("invalid filter")

	// ErrInvalidOptions means the options of a command that changes rows were refused
	// before anything was changed, such as a missing actor. The message names the field.
	ErrInvalidOptions = errors.New("invalid options")
)

// Audit actions, as stored in outbox_audit.action.
const (
	ActionReplay       = "replay"
	ActionCancel       = "cancel"
	ActionPurgePayload = "purge_payload"
	ActionApprove      = "approve"
	ActionReject       = "reject"
)

// Statuses lists every status an intent can have, in the state machine's order.
var Statuses = []string{
	outbox.StatusPending, outbox.StatusDelivering, outbox.StatusDelivered, outbox.StatusDead,
	outbox.StatusCanceled, outbox.StatusAwaitingApproval, outbox.StatusHeld,
}

func knownStatus(s string) bool {
	for _, k := range Statuses {
		if s == k {
			return true
		}
	}
	return false
}

// MaxListLimit is the most rows one page of [List] holds: a larger [Filter].Limit is
// taken as it.
const MaxListLimit = 1000

// Default and maximum sizes.
const (
	defaultListLimit = 50
	defaultBatchSize = 500
	maxBatchSize     = 10_000
)

// Refusal reasons, as reported in the Refused maps of [ReplayResult] and [CancelResult].
// They are sentences for a person; the CLI prints them as they are.
const (
	reasonLocked = "another transaction holds the row (a relay claiming it or recording its outcome, or an approve, reject, cancel or replay in progress); look again in a moment"
)

// lockedRow is a row read under FOR UPDATE by a command that may change it.
type lockedRow struct {
	id             int64
	key            string
	status         string
	leaseOwner     string
	leaseExpiresAt *time.Time
	payloadPurged  bool
	connector      string
	// firstAttemptAt is when the row's first attempt started; zero before any (or when
	// plain SQL wrote an infinity, which no key window is counted from).
	firstAttemptAt time.Time
	// reached says an attempt may have reached the receiver: the latest is marked
	// ambiguous, or the attempt log has an ambiguous or delivered attempt (a later
	// attempt that failed plainly clears the mark, while the earlier one may have acted).
	reached bool
}

// reachedSQL says whether an attempt of row o may have reached the receiver: the latest
// is marked ambiguous, or the attempt log has an ambiguous or delivered attempt (a later
// attempt that failed plainly clears the mark, while the earlier one may have acted).
const reachedSQL = `(o.ambiguous OR EXISTS (SELECT 1 FROM outbox_attempts t
                              WHERE t.outbox_id = o.id AND (t.ambiguous OR t.outcome = 'delivered')))`

// lockSQL locks the rows $1 that no other transaction holds. A row a relay is recording
// an outcome for (or another operator command is changing) is skipped rather than waited
// for: the caller reports it, so a command never waits for a relay's delivery and never
// overwrites what the relay writes (a replay waits only for a claim in progress of a later
// row of its key: see waitLaterClaimsSQL). purged says whether the payload was purged,
// and the last column whether an attempt may have reached the receiver (lockedRow.reached).
const lockSQL = `
SELECT o.id, o.idempotency_key, o.status, coalesce(o.lease_owner, ''), o.lease_expires_at,
       EXISTS (SELECT 1 FROM outbox_audit a WHERE a.outbox_id = o.id AND a.action = 'purge_payload'),
       o.connector, o.first_attempt_at,
       ` + reachedSQL + `
FROM outbox o
WHERE o.id = ANY($1)
ORDER BY o.id
FOR UPDATE OF o SKIP LOCKED`

// lockRows locks the rows ids in tx and returns those it got, by id.
func lockRows(ctx context.Context, tx pgx.Tx, ids []int64) (map[int64]lockedRow, error) {
	rows, err := tx.Query(ctx, lockSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("lock rows: %w", err)
	}
	defer rows.Close()
	out := make(map[int64]lockedRow, len(ids))
	for rows.Next() {
		var (
			r     lockedRow
			first pgtype.Timestamptz
		)
		if err := rows.Scan(&r.id, &r.key, &r.status, &r.leaseOwner, &r.leaseExpiresAt, &r.payloadPurged,
			&r.connector, &first, &r.reached); err != nil {
			return nil, fmt.Errorf("lock rows: %w", err)
		}
		if first.Valid && first.InfinityModifier == pgtype.Finite {
			r.firstAttemptAt = first.Time
		}
		out[r.id] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lock rows: %w", err)
	}
	return out, nil
}

// idleLimitSQL has the server end the session of a command whose client leaves it idle
// in its transaction for five seconds (a process suspended, an operator's laptop asleep,
// a network gone), rather than keep its rows locked until the server notices the
// session is gone, which with TCP keepalive's defaults takes hours: a relay recording
// the outcome of the row before a locked one in its ordering key waits for that row (it
// releases the key's next row, relay/sql.go, lockNextSQL), and every outcome and claim
// of its rounds with it. A command sends its statements one after the other, and never
// idles that long otherwise. Replay sets it with its own limits (internal/replaylock).
const idleLimitSQL = `SELECT set_config('idle_in_transaction_session_timeout', '5s', true)`

// limitIdle runs idleLimitSQL in tx, before it locks any row.
func limitIdle(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, idleLimitSQL); err != nil {
		return fmt.Errorf("limit how long the command may hold its rows: %w", err)
	}
	return nil
}

// target is a row a command was asked to change, before it is locked.
type target struct {
	id  int64
	key string
}

// resolveKeysSQL finds the rows holding keys $1.
const resolveKeysSQL = `SELECT id, idempotency_key FROM outbox WHERE idempotency_key = ANY($1)`

// resolveKeys finds the rows of keys, in the order of keys (repeats dropped), and the
// keys no row has.
func resolveKeys(ctx context.Context, db outbox.DB, keys []string) (found []target, notFound []string, err error) {
	uniq := make([]string, 0, len(keys))
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			uniq = append(uniq, k)
		}
	}
	rows, err := db.Query(ctx, resolveKeysSQL, uniq)
	if err != nil {
		return nil, nil, fmt.Errorf("look up keys: %w", err)
	}
	defer rows.Close()
	ids := make(map[string]int64, len(uniq))
	for rows.Next() {
		var t target
		if err := rows.Scan(&t.id, &t.key); err != nil {
			return nil, nil, fmt.Errorf("look up keys: %w", err)
		}
		ids[t.key] = t.id
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("look up keys: %w", err)
	}
	for _, k := range uniq {
		if id, ok := ids[k]; ok {
			found = append(found, target{id: id, key: k})
		} else {
			notFound = append(notFound, k)
		}
	}
	return found, notFound, nil
}

// existsSQL says whether the row $1 still exists; it takes no lock.
const existsSQL = `SELECT EXISTS (SELECT 1 FROM outbox WHERE id = $1)`

// skipped files a row lockRows did not return: under notFound when it was deleted
// meanwhile (retention or purge), under refused when another transaction holds it.
func skipped(ctx context.Context, tx pgx.Tx, t target, notFound *[]string, refused map[string]string) error {
	var exists bool
	if err := tx.QueryRow(ctx, existsSQL, t.id).Scan(&exists); err != nil {
		return fmt.Errorf("look up row %d: %w", t.id, err)
	}
	if exists {
		refused[t.key] = reasonLocked
	} else {
		*notFound = append(*notFound, t.key)
	}
	return nil
}

// auditSQL records one operator action per row: $1 ids, $2 details (jsonb, parallel to
// $1), action $3, actor $4, reason $5 (NULL when empty), at $6.
const auditSQL = `
INSERT INTO outbox_audit (outbox_id, action, actor, reason, at, details)
SELECT t.id, $3, $4, NULLIF($5, ''), $6, t.details
FROM unnest($1::bigint[], $2::jsonb[]) AS t(id, details)`

// audit writes audit rows in tx.
// details go as JSON text: the simple protocol sends []byte as bytea, which jsonb refuses.
func audit(ctx context.Context, tx pgx.Tx, action, actor, reason string, at time.Time, ids []int64, details []string) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, auditSQL, ids, details, action, actor, reason, at); err != nil {
		return fmt.Errorf("record audit: %w", err)
	}
	return nil
}

// batches splits ts into chunks of at most n.
func batches(ts []target, n int) [][]target {
	var out [][]target
	for len(ts) > 0 {
		k := min(n, len(ts))
		out = append(out, ts[:k])
		ts = ts[k:]
	}
	return out
}

func ids(ts []target) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t.id
	}
	return out
}

// batchSize applies the default and the bound to a BatchSize option.
func batchSize(n int) int {
	return min(cmp.Or(max(n, 0), defaultBatchSize), maxBatchSize)
}

func nowOr(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now()
	}
	return t
}

// dbNowOr is t, or when t is zero the database's clock: whether a lease has expired is
// decided by the clock relays set leases by (they correct theirs to the database's), not
// by an operator's machine, which may run ahead and take a live lease for an expired one.
func dbNowOr(ctx context.Context, db outbox.DB, t time.Time) (time.Time, error) {
	if !t.IsZero() {
		return t, nil
	}
	if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t); err != nil {
		return t, fmt.Errorf("read the database's clock: %w", err)
	}
	return t, nil
}

// unparkSQL makes due again the rows the relay parked behind rows $1, which an
// operator's decision at $3 just ended or released (canceled, replayed, approved,
// rejected), each found by how its last_error begins, $2 (outbox.ParkedBehind, in the
// order of $1): they waited for that row, a retry of it or an operator's decision (see
// relay/sql.go, parkSQL and parkWaitingSQL). They were due when parked and never
// attempted, so their own schedule has passed. They are due from their creation, as
// before they were parked: a row's first attempt measures
// outboxd_commit_to_delivery_seconds from its next_attempt_at when that is later than
// its creation (its NotBefore), and the decision's time would have left out how long
// it waited. A row that must still wait for the row it was parked behind (approved, or
// replayed, it goes first) is held back by the claim's own check meanwhile. A parked row
// that no unfinished row of its key comes before any more (a canceled or rejected row
// was the key's first) is made due too, whichever row its text names: the relay parks
// the rows behind its row in flight behind that row (outbox.WaitingForDelivery), and
// once it is delivered releases only the key's next row, which the decision may end.
const unparkSQL = `
UPDATE outbox f
SET next_attempt_at = least(f.created_at, $3), last_error = NULL, updated_at = $3
FROM unnest($1::bigint[], $2::text[]) AS w(id, prefix)
JOIN outbox c ON c.id = w.id
WHERE f.ordering_key = c.ordering_key AND f.id > c.id
  AND f.status = 'pending' AND f.attempts = 0
  AND (starts_with(f.last_error, w.prefix)
       OR (starts_with(f.last_error, '` + outbox.ParkedPrefix + `') AND NOT EXISTS (
            SELECT 1 FROM outbox p
            WHERE p.ordering_key = f.ordering_key AND p.id < f.id
              AND p.status IN ('pending', 'delivering', 'held', 'awaiting_approval'))))`

// unparkLockSQL locks the rows the relay may park behind rows $1, waiting for a parking
// pass that holds them (relay/sql.go, lockWaitingSQL): such a pass read rows $1 as
// waiting for an operator before this decision committed, and parks rows that were not
// parked yet, which unparkSQL's snapshot would not see as parked. Once it has them,
// unparkSQL, a statement of its own, sees what the pass parked. It locks them in id
// order, as a relay's outcome locks its keys' next rows (relay/sql.go, lockNextSQL), so
// that a decision on rows of several keys does not deadlock with it.
const unparkLockSQL = `
SELECT 1
FROM outbox f JOIN outbox c ON f.ordering_key = c.ordering_key AND f.id > c.id
WHERE c.id = ANY($1) AND f.status = 'pending' AND f.attempts = 0
ORDER BY f.id
FOR UPDATE OF f`

// unpark makes due again, in tx, the rows the relay parked behind rows ids (see
// unparkSQL).
func unpark(ctx context.Context, tx pgx.Tx, ids []int64, now time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	prefixes := make([]string, len(ids))
	for i, id := range ids {
		prefixes[i] = outbox.ParkedBehind(id)
	}
	if _, err := tx.Exec(ctx, unparkLockSQL, ids); err != nil {
		return fmt.Errorf("wait for the relays' parking of the rows behind them: %w", err)
	}
	if _, err := tx.Exec(ctx, unparkSQL, ids, prefixes, now); err != nil {
		return fmt.Errorf("release the rows waiting behind them: %w", err)
	}
	return nil
}
