package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
)

// CancelResult says what [Cancel] did with each key.
type CancelResult struct {
	// Canceled are keys whose rows became canceled.
	Canceled []string `json:"canceled"`
	// Unchanged are keys already canceled.
	Unchanged []string `json:"unchanged"`
	// Refused maps keys left alone to the reason, a sentence for a person.
	Refused map[string]string `json:"refused"`
	// NotFound are keys no row has; the CLI exits 1 when there are any.
	NotFound []string `json:"not_found"`
}

// cancelSQL cancels rows $1 at $2. The lease columns are already NULL for the statuses
// Cancel accepts; clearing them keeps the row tidy if that ever changes. ambiguous is
// kept: the relay whose lease expired during the row's last attempt may still write that
// attempt's outcome, and a delivery it reports is recorded over the cancel (relay/sql.go,
// recordSQL), since the receiver acted. A row the relay parked behind an earlier row of
// its key (outbox.ParkedBehind) loses that text: canceled, it waits for nothing, and
// list, inspect, the API and MCP would show it as waiting.
const cancelSQL = `
UPDATE outbox
SET status = 'canceled', lease_owner = NULL, lease_expires_at = NULL, updated_at = $2,
    last_error = CASE WHEN attempts = 0 AND starts_with(last_error, '` + outbox.ParkedPrefix + `') THEN NULL
                      ELSE last_error END
WHERE id = ANY($1)`

// Cancel cancels the intents with keys, so they are never sent: pending, held and
// awaiting_approval rows become canceled, each with an outbox_audit row (action cancel,
// details {"from_status": ...}). A row that is in flight (delivering), delivered or dead is
// refused, as is one another transaction holds at that moment (a relay claiming it or
// recording its outcome, or an approval in progress): Cancel locks with FOR UPDATE SKIP LOCKED and never waits for or
// overwrites a relay. Already canceled rows are unchanged, so cancelling twice is harmless;
// unknown keys are listed in NotFound. Rows the relay parked behind a canceled row of
// their ordering key (outbox.ParkedBehind) become due at once. Keys are handled in
// batches of 500, each its own transaction, whose session the server ends should its
// client leave it idle for five seconds (see idleLimitSQL).
func Cancel(ctx context.Context, pool *pgxpool.Pool, keys []string, actor, reason string, now time.Time) (CancelResult, error) {
	res := CancelResult{Canceled: []string{}, Unchanged: []string{}, Refused: map[string]string{}, NotFound: []string{}}
	if actor == "" {
		return res, fmt.Errorf("%w: actor: say who cancels, for the audit trail", ErrInvalidOptions)
	}
	// On the database's clock when not given, as leases are (see dbNowOr).
	now, err := dbNowOr(ctx, pool, now)
	if err != nil {
		return res, err
	}
	targets, notFound, err := resolveKeys(ctx, pool, keys)
	if err != nil {
		return res, err
	}
	res.NotFound = append(res.NotFound, notFound...)
	for _, b := range batches(targets, defaultBatchSize) {
		var br CancelResult
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			br = CancelResult{Refused: map[string]string{}}
			return cancelBatch(ctx, tx, b, actor, reason, now, &br)
		})
		if err != nil {
			return res, fmt.Errorf("cancel: %w", err)
		}
		res.Canceled = append(res.Canceled, br.Canceled...)
		res.Unchanged = append(res.Unchanged, br.Unchanged...)
		res.NotFound = append(res.NotFound, br.NotFound...)
		for k, v := range br.Refused {
			res.Refused[k] = v
		}
	}
	return res, nil
}

func cancelBatch(ctx context.Context, tx pgx.Tx, b []target, actor, reason string, now time.Time, br *CancelResult) error {
	if err := limitIdle(ctx, tx); err != nil {
		return err
	}
	locked, err := lockRows(ctx, tx, ids(b))
	if err != nil {
		return err
	}
	var (
		cancelIDs []int64
		details   []string
	)
	for _, t := range b {
		r, ok := locked[t.id]
		if !ok {
			if err := skipped(ctx, tx, t, &br.NotFound, br.Refused); err != nil {
				return err
			}
			continue
		}
		switch r.status {
		case outbox.StatusPending, outbox.StatusHeld, outbox.StatusAwaitingApproval:
			br.Canceled = append(br.Canceled, t.key)
			d, _ := json.Marshal(map[string]string{"from_status": r.status}) // always encodes
			cancelIDs, details = append(cancelIDs, r.id), append(details, string(d))
		case outbox.StatusCanceled:
			br.Unchanged = append(br.Unchanged, t.key)
		case outbox.StatusDelivering:
			if r.leaseExpiresAt != nil && r.leaseExpiresAt.Before(now) {
				br.Refused[t.key] = fmt.Sprintf("stuck: relay %s's lease expired at %s (it stopped or lost the database mid-attempt, "+
					"so the receiver may or may not have acted); it can be canceled once it is back to pending: a relay with its "+
					"connector puts it back, as replay does, and may then send it again at once",
					r.leaseOwner, r.leaseExpiresAt.UTC().Format(time.RFC3339))
				break
			}
			br.Refused[t.key] = fmt.Sprintf("in flight: relay %s is delivering it; its outcome decides", r.leaseOwner)
		case outbox.StatusDelivered:
			br.Refused[t.key] = "already delivered; cancel cannot undo a delivery"
		case outbox.StatusDead:
			br.Refused[t.key] = "dead: it is finished and will not be sent again unless replayed"
		default:
			br.Refused[t.key] = fmt.Sprintf("status %s cannot be canceled", r.status)
		}
	}
	if len(cancelIDs) > 0 {
		if _, err := tx.Exec(ctx, cancelSQL, cancelIDs, now); err != nil {
			return fmt.Errorf("cancel rows: %w", err)
		}
		if err := unpark(ctx, tx, cancelIDs, now); err != nil {
			return err
		}
		// A canceled row no longer holds its ordering key back: wake the relays, whose
		// claims then start at the head of the index, where the key's next row may lie
		// (its own, or now, if it was parked behind the canceled row).
		if _, err := tx.Exec(ctx, `SELECT pg_notify('outbox', '')`); err != nil {
			return fmt.Errorf("notify: %w", err)
		}
	}
	return audit(ctx, tx, ActionCancel, actor, reason, now, cancelIDs, details)
}
