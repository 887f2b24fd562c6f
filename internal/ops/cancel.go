package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/connectors"
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
	// MayHaveActed maps the Canceled keys an attempt of which may have reached the
	// receiver (held or pending after an ambiguous attempt, or delivered once and
	// replayed since: the facts replay warns of too, see lockedRow.reached) to why:
	// canceling stops further attempts, but cannot undo what the receiver may have done.
	// Unchanged keys are in it on the same terms, so that a cancel sent again (a client
	// that lost the first answer) says so too.
	MayHaveActed map[string]Reached `json:"may_have_acted"`
}

// Reached says why the receiver of an intent [Cancel] canceled (or that [EndedReached]
// finds canceled or dead) may have acted already.
type Reached struct {
	// Connector is the intent's connector instance, whose guarantee says how to find out
	// ([CanceledNote]).
	Connector string `json:"connector"`
	// Reason is a sentence for a person.
	Reason string `json:"reason"`
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

// Cancel cancels the intents with keys, so that no relay sends them (again): pending,
// held and awaiting_approval rows become canceled, each with an outbox_audit row (action cancel,
// details {"from_status": ...}). A row that is in flight (delivering), delivered or dead is
// refused, as is one another transaction holds at that moment (a relay claiming it or
// recording its outcome, or an approval in progress): Cancel locks with FOR UPDATE SKIP LOCKED and never waits for or
// overwrites a relay. Already canceled rows are unchanged, so cancelling twice is harmless;
// unknown keys are listed in NotFound. Rows the relay parked behind a canceled row of
// their ordering key (outbox.ParkedBehind) become due at once. Keys are handled in
// batches of 500, each its own transaction, whose session the server ends should its
// client leave it idle for five seconds (see idleLimitSQL).
//
// A canceled row an attempt of which may have reached the receiver (a held row, or a
// pending one, after an ambiguous attempt: no answer, a connection lost mid-request, a
// relay whose lease expired mid-attempt) may have had its effect already, which
// canceling cannot undo: such keys are listed in CancelResult.MayHaveActed, with why.
func Cancel(ctx context.Context, pool *pgxpool.Pool, keys []string, actor, reason string, now time.Time) (CancelResult, error) {
	return CancelWhere(ctx, pool, keys, actor, reason, now, nil)
}

// CancelWhere is [Cancel] for a caller that may cancel only rows of some connectors:
// allow (all when nil) is asked about each row's connector on the row as locked, in the
// cancel's transaction, and a row it refuses is left alone and listed in NotFound, as a
// row the caller may not see. A check on a read before would not do: the row found under
// a key then may be gone by the time the cancel locks it (retention, purge), and another
// row, of another connector, in its place.
func CancelWhere(ctx context.Context, pool *pgxpool.Pool, keys []string, actor, reason string, now time.Time,
	allow func(connector string) bool) (CancelResult, error) {
	res := CancelResult{
		Canceled: []string{}, Unchanged: []string{}, Refused: map[string]string{}, NotFound: []string{},
		MayHaveActed: map[string]Reached{},
	}
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
			br = CancelResult{Refused: map[string]string{}, MayHaveActed: map[string]Reached{}}
			return cancelBatch(ctx, tx, b, actor, reason, now, allow, &br)
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
		for k, v := range br.MayHaveActed {
			res.MayHaveActed[k] = v
		}
	}
	return res, nil
}

func cancelBatch(ctx context.Context, tx pgx.Tx, b []target, actor, reason string, now time.Time,
	allow func(connector string) bool, br *CancelResult) error {
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
		if allow != nil && !allow(r.connector) {
			br.NotFound = append(br.NotFound, t.key)
			continue
		}
		switch r.status {
		case outbox.StatusPending, outbox.StatusHeld, outbox.StatusAwaitingApproval:
			br.Canceled = append(br.Canceled, t.key)
			if r.reached {
				// Canceled all the same: the operator decides, and a further attempt is what
				// they stop. But "canceled" alone reads as "it never happened".
				br.MayHaveActed[t.key] = Reached{Connector: r.connector, Reason: reachedReason(r.status)}
			}
			d, _ := json.Marshal(map[string]string{"from_status": r.status}) // always encodes
			cancelIDs, details = append(cancelIDs, r.id), append(details, string(d))
		case outbox.StatusCanceled:
			br.Unchanged = append(br.Unchanged, t.key)
			if r.reached {
				br.MayHaveActed[t.key] = Reached{Connector: r.connector, Reason: reachedReason(r.status)}
			}
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

// reachedReason says why the receiver of a row canceled from status (held or pending,
// or canceled before) may have acted already (lockedRow.reached).
func reachedReason(status string) string {
	return fmt.Sprintf("%s after an attempt that may have reached the receiver (one that got no answer, lost its connection "+
		"mid-request or whose relay's lease expired mid-attempt, or one delivered before a replay), so the receiver may have "+
		"acted already: canceling stops further attempts but cannot undo what it did; outboxd inspect shows the attempts", status)
}

// endedReachedSQL finds which of the rows with keys $1 are canceled or dead after an
// attempt that may have reached the receiver (reachedSQL), with their connectors and
// statuses.
const endedReachedSQL = `
SELECT o.idempotency_key, o.connector, o.status FROM outbox o
WHERE o.idempotency_key = ANY($1::text[]) AND o.status IN ('canceled', 'dead') AND ` + reachedSQL

// EndedReached maps those of keys whose rows are canceled or dead after an attempt that
// may have reached the receiver to why, in one query: read later, "canceled" alone reads
// as an operation that never happened, and "dead" as one that failed, when the receiver
// may have performed it. A canceled row's reason is the one [Cancel] answered in
// MayHaveActed.
func EndedReached(ctx context.Context, db outbox.DB, keys []string) (map[string]Reached, error) {
	reached, err := byKey(ctx, db, endedReachedSQL, keys, func(rows pgx.Rows, key *string, r *Reached) error {
		var status string
		err := rows.Scan(key, &r.Connector, &status)
		r.Reason = reachedReason(status)
		if status == outbox.StatusDead {
			r.Reason = DeadReachedReason
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("look up attempts of canceled and dead rows: %w", err)
	}
	return reached, nil
}

// DeadReachedReason says why the receiver of a dead row may have acted already, though
// the relay gave up on it ([EndedReached]).
const DeadReachedReason = "dead after an attempt that may have reached the receiver (one that got no answer, lost its " +
	"connection mid-request or whose relay's lease expired mid-attempt, or one delivered before a replay), so the receiver " +
	"may have acted already, though the relay gave up on the attempts after it; outboxd inspect shows the attempts"

// CanceledNote says in plain words how a connector's guarantee helps to find out
// whether the receiver acted on an attempt of a canceled intent that may have reached
// it ([CancelResult].MayHaveActed).
func CanceledNote(g connectors.Guarantee) string {
	switch g {
	case connectors.Enforced:
		return "enforced: the receiver keeps what it did under the key (for its key window), so it can tell whether it acted; " +
			"an intent enqueued again under a new key would act again"
	case connectors.Reconciled:
		return "reconciled: the effect carries the key (a Slack message's metadata), so look for it at the receiver"
	case connectors.Forwarded:
		return "forwarded: the key travelled with the request (a header, an email's Message-ID) but nothing is known to keep it, " +
			"so check the receiver itself"
	default:
		return fmt.Sprintf("unknown guarantee %q: check the receiver itself", string(g))
	}
}
