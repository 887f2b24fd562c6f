package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// decideFunc is ops.Approve or ops.Reject.
type decideFunc func(ctx context.Context, pool *pgxpool.Pool, key, actor, reason string, now time.Time) (outbox.Intent, error)

func newApproveCmd(e *env) *cobra.Command {
	return newDecideCmd(e, "approve", ops.Approve,
		"Approve an intent awaiting approval, so the relay delivers it",
		"approve moves an awaiting_approval intent to pending, with an audit entry naming $USER and "+
			"--reason; the relay then delivers it. Approving an intent already past approval changes "+
			"nothing, so approving twice is harmless; for a held or dead one, which approval does not let go, "+
			"approve says on stderr what does (replay, cancel). A rejected or canceled intent cannot be "+
			"approved: approve exits 1.",
		`  outboxd approve refund-order-42 --reason "checked with the customer"`)
}

func newRejectCmd(e *env) *cobra.Command {
	return newDecideCmd(e, "reject", ops.Reject,
		"Reject an intent awaiting approval, so it is never sent",
		"reject moves an awaiting_approval intent to canceled, with an audit entry naming $USER and "+
			"--reason. Rejecting a canceled intent changes nothing. An intent already approved cannot be "+
			"rejected (reject exits 1); cancel it instead while it is still pending.",
		`  outboxd reject refund-order-42 --reason "duplicate of refund-order-41"`)
}

func newDecideCmd(e *env, verb string, do decideFunc, short, long, example string) *cobra.Command {
	var (
		db     dbFlag
		reason string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     verb + " KEY",
		Short:   short,
		Long:    long,
		Example: example,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("%s needs exactly one idempotency key", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := db.open(ctx, e)
			if err != nil {
				return err
			}
			defer pool.Close()
			in, err := do(ctx, pool, args[0], actor(e), reason, time.Time{})
			if err != nil {
				return opsError(err)
			}
			if verb == "approve" {
				if note := approvedNothing(in); note != "" {
					fmt.Fprintln(e.stderr, note)
				}
			}
			if asJSON {
				return writeJSON(e.stdout, ops.WithoutCredentials(in)) // as the intent API shows it
			}
			fmt.Fprintf(e.stdout, "%s: %s\n", keyText(in.Key), in.Status)
			return nil
		},
	}
	db.register(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit trail")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the intent as JSON")
	return cmd
}

// approvedNothing says what to do instead when approve found a row that waits for an
// operator, or has ended, rather than for an approval: approving it changes nothing (so
// approving twice is harmless), and "KEY: held" alone read as though it had been let go.
func approvedNothing(in outbox.Intent) string {
	switch in.Status {
	case outbox.StatusHeld:
		return fmt.Sprintf("note: %s is held, not awaiting approval, and approve changed nothing: an earlier "+
			"attempt may have reached the receiver, so an operator decides with `outboxd replay --key` "+
			"(send it again, same key) or `outboxd cancel`", keyText(in.Key))
	case outbox.StatusDead:
		return fmt.Sprintf("note: %s is dead, not awaiting approval, and approve changed nothing: "+
			"`outboxd replay --key` sends it again", keyText(in.Key))
	}
	return ""
}
