package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

func newListCmd(e *env) *cobra.Command {
	var (
		db     dbFlag
		f      filterFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List intents, newest first, with filters",
		Long: "list prints the intents that match every filter given, newest first, a page at a time. When " +
			"there are more, the last line says how to get the next page (\"next page: --after <cursor>\"); " +
			"pass the same filters with it. As grep does, list exits 1 when no intent matches (but 0 for an " +
			"empty page asked for with --after).",
		Example: `  outboxd list --status dead --connector webhook:crm
  outboxd list --status dead,held --older-than 1h --error-contains timeout
  outboxd list --key-prefix order-42 --json | jq '.intents[].key'
  outboxd list --status dead --after eyJjIjoi...   # the next page`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := db.open(ctx, e)
			if err != nil {
				return err
			}
			defer pool.Close()
			page, err := ops.List(ctx, pool, filter)
			if err != nil {
				return opsError(err)
			}
			if asJSON {
				intents := make([]outbox.Intent, 0, len(page.Intents))
				for _, in := range page.Intents {
					intents = append(intents, ops.WithoutCredentials(in)) // as the intent API shows them
				}
				err = writeJSON(e.stdout, listJSON{Intents: intents, Next: page.Next})
			} else {
				err = writeList(e.stdout, page)
			}
			if err == nil && len(page.Intents) == 0 && filter.After == "" {
				// Like grep: nothing found is a failure a script can test for.
				return errListNoMatch
			}
			return err
		},
	}
	db.register(cmd)
	f.register(cmd, true, 50, "rows a page, 1 to 1000")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {\"intents\": [...], \"next\": \"<cursor or empty>\"}")
	return cmd
}

// errNoMatch is the failure of a replay whose filters select no rows (exit 1).
var errNoMatch = errors.New("no intents match the filters; nothing was changed")

// errListNoMatch is the failure of a list that finds no rows (exit 1). list reads only:
// "nothing was changed", as replay says, had an operator wonder what it might have
// changed.
var errListNoMatch = errors.New("no intents match the filters")

type listJSON struct {
	Intents []outbox.Intent `json:"intents"`
	Next    string          `json:"next"`
}

func writeList(w io.Writer, page ops.Page) error {
	if len(page.Intents) == 0 {
		fmt.Fprintln(w, "no intents match")
		return nil
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "KEY\tCONNECTOR\tSTATUS\tATTEMPTS\tCREATED\tNEXT ATTEMPT\tLAST ERROR")
	for _, in := range page.Intents {
		next := "-" // as in inspect: only a row waiting to be sent has a next attempt
		if in.Status == outbox.StatusPending || in.Status == outbox.StatusAwaitingApproval {
			next = stamp(in.NextAttemptAt) // awaiting approval: not before this, once approved
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", keyText(in.Key), in.Connector, in.Status,
			strconv.Itoa(in.Attempts), stamp(in.CreatedAt), next, cell(in.LastError, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(w, "next page: --after %s\n", page.Next)
	}
	return nil
}
