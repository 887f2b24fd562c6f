package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/ops"
)

func newCancelCmd(e *env) *cobra.Command {
	var (
		db     dbFlag
		reason string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "cancel KEY...",
		Short: "Cancel intents so they are never sent",
		Long: "cancel makes the intents with the given idempotency keys canceled: pending, held and " +
			"awaiting-approval rows are never sent. Rows in flight, delivered or dead are refused and left as " +
			"they are; already canceled rows are unchanged. Each canceled row gets an audit entry naming $USER " +
			"and --reason.\n\n" +
			"Every key is handled, then cancel exits 1 if any key had no row or was refused.",
		Example: `  outboxd cancel order-42-confirmation --reason "order was refunded"
  outboxd cancel key-1 key-2 key-3 --json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s needs at least one idempotency key", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, keys []string) error {
			ctx := cmd.Context()
			pool, err := db.open(ctx, e)
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := ops.Cancel(ctx, pool, keys, actor(e), reason, time.Time{})
			if err != nil && len(res.Canceled)+len(res.Unchanged)+len(res.Refused) > 0 {
				// Earlier batches were committed: say which rows they canceled. When
				// none was, an empty result would pass for the answer (as purge, which
				// reports only rows it purged).
				_ = reportCancel(e, res, asJSON)
			}
			if err != nil {
				return opsError(err)
			}
			if err := reportCancel(e, res, asJSON); err != nil {
				return err
			}
			return keysLeftError("canceled", res.NotFound, res.Refused)
		},
	}
	db.register(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit trail")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// reportCancel prints what a cancel did.
func reportCancel(e *env, res ops.CancelResult, asJSON bool) error {
	if asJSON {
		if err := writeJSON(e.stdout, res); err != nil {
			return err
		}
	} else {
		w := e.stdout
		fmt.Fprintf(w, "canceled: %d\n", len(res.Canceled))
		for _, k := range res.Canceled {
			fmt.Fprintf(w, "  %s\n", keyText(k))
		}
		writeLeftAlone(w, res.Unchanged, func(string) string { return "already canceled" }, res.Refused, res.NotFound)
	}
	return nil
}
