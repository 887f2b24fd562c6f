package ops

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/finished"
)

// PurgeOptions control [Purge].
type PurgeOptions struct {
	// DryRun counts the rows that would be purged and changes nothing.
	DryRun bool
	// PayloadOnly keeps the rows and replaces their payload and headers with {},
	// keeping key, status, result and attempts: the record of what happened stays, the
	// data that was sent goes (headers can hold personal data and the receiver's
	// credentials). Each row gets an outbox_audit row (action purge_payload).
	PayloadOnly bool
	// BatchSize is how many rows each statement purges. Defaults to 500.
	BatchSize int
	// Now is the clock olderThan counts from. Defaults to the database's current time:
	// relays write when rows finished on it (see dbNowOr), and a machine whose clock
	// runs ahead would purge rows younger than asked.
	Now time.Time
	// Actor names who purges, for the audit trail of PayloadOnly. Defaults to "purge".
	Actor string
	// Reason says why, for the audit trail of PayloadOnly.
	Reason string
}

// PurgeResult says how many rows [Purge] deleted or emptied (or, with DryRun, would).
type PurgeResult struct {
	Rows   int  `json:"rows"`
	DryRun bool `json:"dry_run"`
}

// purgeCountSQL counts finished rows last changed before $1; with $2, only those whose
// payload or headers are still there.
const purgeCountSQL = `
SELECT count(*) FROM outbox
WHERE status IN ('delivered', 'canceled') AND updated_at < $1
  AND (NOT $2 OR payload <> '{}'::jsonb OR headers <> '{}'::jsonb)`

// purgeDeleteSQL deletes up to $2 finished rows last changed before $1 (attempts and
// audit rows cascade), of every connector ($3 NULL), after ($4, $5), as
// finished.DeleteSQL says: the relay's retention deletes its own rows the same way.
const purgeDeleteSQL = finished.DeleteSQL

// purgePayloadSQL empties the payload and headers of up to $2 finished rows last changed
// before $1 and records it for each ($3 actor, $4 reason, $5 time). updated_at is left
// alone so retention still counts from when the row finished. A row whose payload and
// headers are already {} has nothing to purge, which also makes a second run a no-op.
// It takes the rows after ($6, $7), the (updated_at, id) of the last row of the run's
// previous batch, and returns how many it purged and its own last row's: the rows a
// batch purged keep their place in outbox_finished_age, and a batch that started at
// the oldest row read every row the run had purged so far: once 200,000 were, each
// batch of 500 read 200,500 rows (20,600 buffers; from the cursor, 513 and 56).
const purgePayloadSQL = `
WITH victims AS (
    SELECT id, updated_at FROM outbox
    WHERE status IN ('delivered', 'canceled') AND updated_at < $1
      AND (payload <> '{}'::jsonb OR headers <> '{}'::jsonb)
      AND (updated_at, id) > ($6::timestamptz, $7::bigint)
    ORDER BY updated_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), upd AS (
    -- A row without a fingerprint (written by plain SQL) gets an empty one: its request
    -- is no longer known, so no request, {} included, is taken for it.
    UPDATE outbox o SET payload = '{}'::jsonb, headers = '{}'::jsonb, fingerprint = coalesce(o.fingerprint, '\x'::bytea)
    FROM victims v WHERE o.id = v.id RETURNING o.id
), audited AS (
    INSERT INTO outbox_audit (outbox_id, action, actor, reason, at)
    SELECT id, 'purge_payload', $3, NULLIF($4, ''), $5 FROM upd
)
SELECT (SELECT count(*) FROM upd), max(updated_at), (array_agg(id ORDER BY updated_at DESC, id DESC))[1]
FROM victims`

// Purge deletes delivered and canceled rows last changed more than olderThan before
// opts.Now, in batches of opts.BatchSize rows, each batch one statement. With
// opts.PayloadOnly it keeps the rows and empties their payload instead. It never
// touches a row in any other status, so nothing in flight or still to be sent is lost,
// and it skips rows another transaction holds. Running it again is harmless.
func Purge(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, opts PurgeOptions) (PurgeResult, error) {
	res := PurgeResult{DryRun: opts.DryRun}
	if olderThan < 0 {
		return res, fmt.Errorf("%w: olderThan: %s is negative", ErrInvalidOptions, olderThan)
	}
	now, err := dbNowOr(ctx, pool, opts.Now)
	if err != nil {
		return res, fmt.Errorf("purge: %w", err)
	}
	cutoff := now.Add(-olderThan)
	if opts.DryRun {
		if err := pool.QueryRow(ctx, purgeCountSQL, cutoff, opts.PayloadOnly).Scan(&res.Rows); err != nil {
			return res, fmt.Errorf("purge: count: %w", err)
		}
		return res, nil
	}
	size := batchSize(opts.BatchSize)
	actor := opts.Actor
	if actor == "" {
		actor = "purge"
	}
	// Where the next batch starts: after the last row of the previous one.
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	afterID := int64(math.MinInt64) // plain SQL may write any id
	for {
		var (
			n      int64
			lastID *int64
			err    error
		)
		if opts.PayloadOnly {
			err = pool.QueryRow(ctx, purgePayloadSQL, cutoff, size, actor, opts.Reason, now, after, afterID).
				Scan(&n, &after, &lastID)
		} else {
			err = pool.QueryRow(ctx, purgeDeleteSQL, cutoff, size, nil, after, afterID).Scan(&n, &after, &lastID)
		}
		if lastID != nil {
			afterID = *lastID
		}
		if err != nil {
			return res, fmt.Errorf("purge: %w", err)
		}
		res.Rows += int(n)
		if n < int64(size) {
			return res, nil
		}
	}
}
