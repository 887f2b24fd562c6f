package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
)

// ErrConflictState means a decision cannot apply to an intent in its current status,
// such as approving one that was rejected or canceled. The message names the status.
var ErrConflictState = errors.New("intent is not in a state that allows this")

// lockOneSQL locks the row of key $1 and returns it. Unlike lockSQL it waits for another
// transaction holding the row: an approval concerns one row that no relay claims while it
// awaits approval, so the wait is at most another operator's short transaction, and two
// people deciding at once see each other's decision instead of a "locked" refusal.
const lockOneSQL = `
SELECT ` + outbox.IntentColumns + `
FROM outbox
WHERE idempotency_key = $1
FOR UPDATE`

// decideSQL moves row $1 to status $2 at $3. Approval keeps next_attempt_at, so a
// not_before in the future still holds.
const decideSQL = `UPDATE outbox SET status = $2, updated_at = $3 WHERE id = $1`

// Approve lets the intent with key be delivered: awaiting_approval becomes pending, with
// an outbox_audit row (action approve, details {"from_status": ...}), and idle relays are
// woken at commit. Rows the relay parked behind it (outbox.WaitingForOperator) become
// due at once, to go after it. Approving an intent that is already past approval
// (pending, delivering, delivered, dead, held) changes nothing and returns it, so
// approving twice is harmless.
// A canceled intent (rejected or canceled) is refused with an error wrapping
// [ErrConflictState]; an unknown key with one wrapping [outbox.ErrNotFound].
func Approve(ctx context.Context, pool *pgxpool.Pool, key, actor, reason string, now time.Time) (outbox.Intent, error) {
	return decide(ctx, pool, key, actor, reason, now, ActionApprove, nil)
}

// Decide is [Approve] (action [ActionApprove]) or [Reject] ([ActionReject]) with check run
// on the row as locked, before anything changes: an error of check refuses the decision
// and is returned as it is. A caller whose rule depends on the row (who proposed it, its
// connector) must check it here, in the decision's transaction: the row a read before
// found under the key may be gone by the time the decision locks it (retention, purge),
// and another row in its place.
func Decide(ctx context.Context, pool *pgxpool.Pool, action, key, actor, reason string, now time.Time,
	check func(outbox.Intent) error) (outbox.Intent, error) {
	if action != ActionApprove && action != ActionReject {
		return outbox.Intent{}, fmt.Errorf("%w: action %q: approve or reject", ErrInvalidOptions, action)
	}
	return decide(ctx, pool, key, actor, reason, now, action, check)
}

// Reject refuses the intent with key: awaiting_approval becomes canceled, with an
// outbox_audit row (action reject), and rows the relay parked behind it
// (outbox.WaitingForOperator) become due at once. Rejecting a canceled intent changes
// nothing and returns it, so rejecting twice is harmless. An intent past approval
// (pending and later) is refused with an error wrapping [ErrConflictState]; a pending or
// held one can be canceled with [Cancel] instead.
// An unknown key gives an error wrapping [outbox.ErrNotFound].
func Reject(ctx context.Context, pool *pgxpool.Pool, key, actor, reason string, now time.Time) (outbox.Intent, error) {
	return decide(ctx, pool, key, actor, reason, now, ActionReject, nil)
}

func decide(ctx context.Context, pool *pgxpool.Pool, key, actor, reason string, now time.Time, action string,
	check func(outbox.Intent) error) (outbox.Intent, error) {
	if actor == "" {
		return outbox.Intent{}, fmt.Errorf("%w: actor: say who decides, for the audit trail", ErrInvalidOptions)
	}
	var out outbox.Intent
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := limitIdle(ctx, tx); err != nil {
			return err
		}
		in, err := outbox.ScanIntent(tx.QueryRow(ctx, lockOneSQL, key))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: no intent has key %q", outbox.ErrNotFound, key)
		}
		if err != nil {
			return fmt.Errorf("lock %q: %w", key, err)
		}
		if check != nil {
			if err := check(in); err != nil {
				return err
			}
		}
		out = in
		// On the database's clock when not given, as every other time of the row (see dbNowOr).
		if now, err = dbNowOr(ctx, tx, now); err != nil {
			return err
		}
		switch {
		case in.Status == outbox.StatusAwaitingApproval:
			// decided below
		case action == ActionApprove && in.Status == outbox.StatusCanceled:
			return fmt.Errorf("%w: intent %q is canceled (rejected or canceled); it cannot be approved", ErrConflictState, key)
		case action == ActionApprove:
			return nil // already approved, or never needed approval
		case in.Status == outbox.StatusCanceled:
			return nil // already rejected or canceled
		case in.Status == outbox.StatusPending || in.Status == outbox.StatusHeld:
			return fmt.Errorf("%w: intent %q is %s, past approval; cancel it instead of rejecting", ErrConflictState, key, in.Status)
		default:
			// Cancel refuses these too (in flight, delivered, dead): no point sending the
			// operator there.
			return fmt.Errorf("%w: intent %q is %s, past approval; it can no longer be rejected or canceled", ErrConflictState, key, in.Status)
		}
		to := outbox.StatusPending
		if action == ActionReject {
			to = outbox.StatusCanceled
		}
		if _, err := tx.Exec(ctx, decideSQL, in.ID, to, now); err != nil {
			return fmt.Errorf("%s %q: %w", action, key, err)
		}
		// Rows the relay parked behind it while it awaited a decision are due again (once
		// approved, it still goes first: see unparkSQL).
		if err := unpark(ctx, tx, []int64{in.ID}, now); err != nil {
			return err
		}
		d, _ := json.Marshal(map[string]string{"from_status": in.Status}) // always encodes
		if err := audit(ctx, tx, action, actor, reason, now, []int64{in.ID}, []string{string(d)}); err != nil {
			return err
		}
		// Wake relays at commit, as an insert would: an approved row is due, and a
		// rejected one no longer holds its ordering key back; either way a row may now be
		// due behind where their claims start.
		if _, err := tx.Exec(ctx, `SELECT pg_notify('outbox', '')`); err != nil {
			return fmt.Errorf("notify: %w", err)
		}
		out.Status, out.UpdatedAt = to, now
		return nil
	})
	if err != nil {
		return outbox.Intent{}, err
	}
	return out, nil
}
