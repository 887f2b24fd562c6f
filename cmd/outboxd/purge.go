package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/ops"
)

func newPurgeCmd(e *env) *cobra.Command {
	var (
		db     dbFlag
		o      ops.PurgeOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete delivered and canceled intents older than a given age",
		Long: "purge deletes delivered and canceled rows last changed more than --older-than ago, with their " +
			"attempts and audit trail. It never touches a row in any other status. With --payload-only it keeps " +
			"the rows and their record and empties only their payload and headers. --dry-run counts and changes nothing.",
		Example: `  outboxd purge --older-than 720h --dry-run
  outboxd purge --older-than 168h
  outboxd purge --older-than 24h --payload-only --reason "GDPR erasure"`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("older-than") {
				return usagef("purge needs --older-than, such as --older-than 168h")
			}
			olderThan, err := cmd.Flags().GetDuration("older-than")
			if err != nil {
				return usageError{err}
			}
			if olderThan < 0 {
				return usagef("--older-than: %s is negative", olderThan)
			}
			if cmd.Flags().Changed("reason") && !o.PayloadOnly {
				return usagef("--reason is recorded only with --payload-only; deleted rows keep no audit trail")
			}
			if o.BatchSize < 0 {
				return usagef("--batch-size: %d is negative", o.BatchSize)
			}
			o.Actor = actor(e)
			ctx := cmd.Context()
			pool, err := db.open(ctx, e)
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := ops.Purge(ctx, pool, olderThan, o)
			if err != nil {
				if res.Rows > 0 {
					// Earlier batches were committed: say how many rows they purged.
					_ = reportPurge(e, res, o, asJSON)
				}
				return opsError(err)
			}
			return reportPurge(e, res, o, asJSON)
		},
	}
	db.register(cmd)
	fs := cmd.Flags()
	fs.Duration("older-than", 0, "purge rows delivered or canceled more than this long ago (required), e.g. 168h")
	fs.BoolVar(&o.DryRun, "dry-run", false, "count the rows and change nothing")
	fs.BoolVar(&o.PayloadOnly, "payload-only", false, "keep the rows and empty their payload and headers")
	fs.StringVar(&o.Reason, "reason", "", "why, for the audit trail (with --payload-only only)")
	fs.IntVar(&o.BatchSize, "batch-size", 0, "rows per statement (default 500)")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// reportPurge prints what a purge did.
func reportPurge(e *env, res ops.PurgeResult, o ops.PurgeOptions, asJSON bool) error {
	if asJSON {
		return writeJSON(e.stdout, purgeJSON{PurgeResult: res, PayloadOnly: o.PayloadOnly})
	}
	switch {
	case o.DryRun && o.PayloadOnly:
		fmt.Fprintf(e.stdout, "dry run: would empty the payload of %d rows\n", res.Rows)
	case o.DryRun:
		fmt.Fprintf(e.stdout, "dry run: would delete %d rows\n", res.Rows)
	case o.PayloadOnly:
		fmt.Fprintf(e.stdout, "emptied the payload of %d rows\n", res.Rows)
	default:
		fmt.Fprintf(e.stdout, "deleted %d rows\n", res.Rows)
	}
	return nil
}

type purgeJSON struct {
	ops.PurgeResult
	PayloadOnly bool `json:"payload_only"`
}
