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
		Short: "Cancel intents so that no relay sends them (again)",
		Long: "cancel makes the intents with the given idempotency keys canceled: pending, held and " +
			"awaiting-approval rows are not sent (again). A row an earlier attempt of which may have reached the " +
			"receiver (held, or pending after an ambiguous attempt) may have had its effect already, which " +
			"canceling cannot undo: cancel prints a warning for each such key, with what its connector's " +
			"guarantee says about finding out (--json: may_have_acted). Rows in flight, delivered or dead are " +
			"refused and left as they are; already canceled rows are unchanged. Each canceled row gets an audit " +
			"entry naming $USER and --reason.\n\n" +
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
			dsn, _ := db.resolve(e)
			g := guarantees(e, dsn)
			res, err := ops.Cancel(ctx, pool, keys, actor(e), reason, time.Time{})
			if err != nil && len(res.Canceled)+len(res.Unchanged)+len(res.Refused) > 0 {
				// Earlier batches were committed: say which rows they canceled. When
				// none was, an empty result would pass for the answer (as purge, which
				// reports only rows it purged).
				_ = reportCancel(e, res, g, asJSON)
			}
			if err != nil {
				return opsError(err)
			}
			if err := reportCancel(e, res, g, asJSON); err != nil {
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

type cancelJSON struct {
	ops.CancelResult
	// MayHaveActedNotes say, for the connectors of the rows in MayHaveActed, how their
	// guarantee helps to find out whether the receiver acted.
	MayHaveActedNotes []string `json:"may_have_acted_notes,omitempty"`
}

// reportCancel prints what a cancel did: a warning for each canceled row whose receiver
// may have acted already, and what the guarantees g of their connectors say about it.
func reportCancel(e *env, res ops.CancelResult, g guaranteeSet, asJSON bool) error {
	notes := canceledNotes(res, g)
	if asJSON {
		if err := writeJSON(e.stdout, cancelJSON{CancelResult: res, MayHaveActedNotes: notes}); err != nil {
			return err
		}
	} else {
		w := e.stdout
		fmt.Fprintf(w, "canceled: %d\n", len(res.Canceled))
		for _, k := range res.Canceled {
			fmt.Fprintf(w, "  %s\n", keyText(k))
		}
		writeLeftAlone(w, res.Unchanged, func(string) string { return "already canceled" }, res.Refused, res.NotFound)
		for _, k := range sortedKeys(res.MayHaveActed) {
			m := res.MayHaveActed[k]
			fmt.Fprintf(w, "warning: %s (%s): %s\n", keyText(k), printable(m.Connector), printable(m.Reason))
		}
		if len(notes) > 0 {
			fmt.Fprintln(w, "whether the receiver acted, by its guarantee:")
			for _, n := range notes {
				fmt.Fprintf(w, "  %s\n", printable(n))
			}
		}
	}
	return nil
}

// canceledNotes returns an ops.CanceledNote per connector of the canceled rows whose
// receiver may have acted (ops.CancelResult.MayHaveActed).
func canceledNotes(res ops.CancelResult, g guaranteeSet) []string {
	seen := map[string]bool{}
	for _, m := range res.MayHaveActed {
		seen[m.Connector] = true
	}
	var notes []string
	for _, c := range sortedKeys(seen) {
		gu, ok := g.of[c]
		if !ok {
			notes = append(notes, fmt.Sprintf("%s: guarantee unknown here (%s): check the receiver itself", c, g.unknownWhy))
			continue
		}
		notes = append(notes, fmt.Sprintf("%s: %s", c, ops.CanceledNote(gu)))
	}
	return notes
}
