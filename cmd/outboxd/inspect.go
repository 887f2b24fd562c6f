package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

func newInspectCmd(e *env) *cobra.Command {
	var (
		db     dbFlag
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "Show one intent: row, payload, attempts, result and audit trail",
		Long: "inspect prints everything known about the intent with idempotency key KEY: the row, its payload, " +
			"every delivery attempt (when, which relay, how long, the outcome, the error, whether the receiver " +
			"may have acted), the receiver's stored result, and the operator actions on it.",
		Example: `  outboxd inspect order-42-confirmation
  outboxd inspect order-42-confirmation --json | jq .attempts`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("%s takes one idempotency key, got %d arguments", cmd.CommandPath(), len(args))
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
			// One snapshot for the row, its attempts and its audit trail.
			var d inspectJSON
			err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
				func(tx pgx.Tx) error {
					var err error
					if d.Detail, err = ops.Inspect(ctx, tx, args[0]); err != nil {
						return err
					}
					if d.CopyOf, err = ops.CopyOf(ctx, tx, args[0]); err != nil {
						return err
					}
					// Where the operation went, looked up as the intent API's answers look it up
					// for a page (intent.Service.CopiesOf), without a token to narrow it.
					latest, err := ops.LatestCopy(ctx, tx, cmp.Or(d.CopyOf, args[0]))
					if err != nil || latest == "" || latest == args[0] {
						return err
					}
					status, err := ops.StatusOf(ctx, tx, []string{latest})
					if st, ok := status[latest]; ok {
						d.ReplayedAs = &intent.Copy{Key: latest, Status: st.Status}
					} else if err == nil {
						d.ReplayedAs = &intent.Copy{Key: latest, Gone: true}
					}
					return err
				})
			if errors.Is(err, outbox.ErrNotFound) {
				return fmt.Errorf("no intent has key %q", args[0])
			}
			if err != nil {
				return err
			}
			d.Intent = ops.WithoutCredentials(d.Intent) // as the intent API shows it
			if asJSON {
				if d.Attempts == nil {
					d.Attempts = []ops.Attempt{}
				}
				if d.Audit == nil {
					d.Audit = []ops.AuditEntry{}
				}
				return writeJSON(e.stdout, d)
			}
			return writeDetail(e.stdout, d)
		},
	}
	db.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// inspectJSON is what inspect shows of a row: ops.Detail, and the row it copies.
type inspectJSON struct {
	ops.Detail
	// CopyOf is the key of the row that replay --new-key made this row a copy of, if it
	// did. The row names its copies in its replay audit entries ({"new_key": ...}); the
	// copy's own key holds the row's only as a readable prefix, cut at 80 characters
	// and with '/' or a space as '_', which more than one key can give.
	CopyOf string `json:"copy_of,omitempty"`
	// ReplayedAs is the latest copy that replay --new-key made of the row's operation
	// (of this row, or of the row it copies), when that is not this row: where the
	// operation went, as the intent API names it. The row itself stays dead or held, and
	// its status and attempts alone read as an operation that failed or waits for a
	// person, when its copy may have been delivered.
	ReplayedAs *intent.Copy `json:"replayed_as,omitempty"`
}

func writeDetail(w io.Writer, d inspectJSON) error {
	in := d.Intent
	tw := newTable(w)
	field := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
	field("key", keyText(in.Key))
	if d.CopyOf != "" {
		field("copy of", keyText(d.CopyOf)+" (made by replay --new-key)")
	}
	if c := d.ReplayedAs; c != nil {
		where := fmt.Sprintf("%s, %s now (replay --new-key re-executed the operation under that key: follow it)",
			keyText(c.Key), c.Status)
		if c.Gone {
			where = keyText(c.Key) + ", gone: delivered or canceled, then deleted by retention or purge " +
				"(replay --new-key re-executed the operation under that key)"
		}
		field("replayed as", where)
	}
	field("id", strconv.FormatInt(in.ID, 10))
	field("connector", in.Connector)
	field("status", in.Status)
	field("attempts", strconv.Itoa(in.Attempts))
	field("ambiguous", ambiguity(d.Detail))
	field("ordering key", orDash(in.OrderingKey, keyText))
	field("created", stamp(in.CreatedAt))
	field("updated", stamp(in.UpdatedAt))
	field("first attempt", stamp(d.FirstAttemptAt))
	next := "-" // as in list: only a row waiting to be sent has a next attempt
	if in.Status == outbox.StatusPending || in.Status == outbox.StatusAwaitingApproval {
		next = stamp(in.NextAttemptAt) // awaiting approval: not before this, once approved
	}
	field("next attempt", next)
	field("delivered", stamp(in.DeliveredAt))
	if d.LeaseOwner != "" {
		lease := fmt.Sprintf("%s until %s", printable(d.LeaseOwner), stamp(d.LeaseExpiresAt))
		if d.LeaseExpired {
			lease = fmt.Sprintf("%s, expired at %s: stuck until a relay with connector %s puts it back "+
				"(the receiver may have acted on that attempt)", printable(d.LeaseOwner), stamp(d.LeaseExpiresAt), in.Connector)
		}
		field("lease", lease)
	}
	if in.CreatedBy != "" {
		field("created by", printable(in.CreatedBy))
	}
	for _, k := range sortedKeys(in.Headers) {
		field("header "+printable(k), printable(in.Headers[k]))
	}
	field("last error", cell(in.LastError, 0))
	if err := tw.Flush(); err != nil {
		return err
	}

	// A payload purge leaves {} (and no headers): said so, or it reads as the request the
	// application made.
	if at, ok := payloadPurgedAt(d.Audit); ok {
		fmt.Fprintf(w, "\npayload (emptied by outboxd purge --payload-only at %s):\n", stamp(at))
	} else {
		fmt.Fprintln(w, "\npayload:")
	}
	writeIndentedJSON(w, in.Payload)

	fmt.Fprintf(w, "\nattempts (%d):\n", len(d.Attempts))
	if len(d.Attempts) > 0 {
		tw = newTable(w)
		fmt.Fprintln(tw, "  #\tSTARTED\tRELAY\tDURATION\tOUTCOME\tAMBIGUOUS\tERROR")
		for _, a := range d.Attempts {
			dur, outcome := age(a.Duration), a.Outcome
			if a.FinishedAt.IsZero() {
				dur = "-"
				if outcome == "" {
					// The row's attempt in progress (ops.Inspect), or abandoned by its relay.
					outcome = "in flight"
					if d.LeaseExpired {
						outcome = "lease expired"
					}
				}
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, stamp(a.StartedAt), cell(a.Relay, 0),
				dur, cell(outcome, 0), yesNo(a.Ambiguous, "yes"), cell(a.Error, 0))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nresult:")
	writeIndentedJSON(w, in.Result)

	fmt.Fprintf(w, "\naudit (%d):\n", len(d.Audit))
	if len(d.Audit) > 0 {
		tw = newTable(w)
		fmt.Fprintln(tw, "  AT\tACTION\tACTOR\tREASON\tDETAILS")
		for _, a := range d.Audit {
			// JSON text, as jsonb writes it: escaped as the payload and the result are,
			// since jsonb leaves C1 controls, DEL and format characters as they are, and
			// plain SQL or an older outboxd may have written any details.
			details := strings.TrimSpace(string(jsonEscaped(a.Details)))
			if details == "" || details == "null" || details == "{}" {
				details = "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", stamp(a.At), a.Action, cell(a.Actor, 0), cell(a.Reason, 0), details)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// ambiguity says whether the receiver may have acted on an attempt of the row. The row's
// flag is its latest attempt's, so "no" alone would hide an earlier ambiguous attempt
// (a row that died of a plain failure after one: replayed, the receiver may act twice)
// and the attempt of a row whose lease expired, flagged only once a relay puts it back.
// Nor does it cover a delivery the row has had before a replay (--redeliver) put it
// back: then the receiver did act, whatever the attempts since say, as cancel's warning
// and replay's notes count it (ops.CancelResult.MayHaveActed).
func ambiguity(d ops.Detail) string {
	const latest = "yes: the receiver may have acted on the latest attempt"
	if d.Ambiguous {
		return latest
	}
	last := len(d.Attempts) - 1
	for i := last; i >= 0; i-- {
		a := d.Attempts[i]
		switch {
		case a.Ambiguous && i == last:
			return latest
		case a.Ambiguous:
			return fmt.Sprintf("no, but attempt %d was: the receiver may have acted then", a.Attempt)
		case a.Outcome == outbox.StatusDelivered && (i < last || d.Intent.Status != outbox.StatusDelivered):
			return fmt.Sprintf("no, but attempt %d was delivered: the receiver acted then, before the row was replayed", a.Attempt)
		}
	}
	return "no"
}

// writeIndentedJSON prints raw JSON indented under a heading; "  -" when empty.
func writeIndentedJSON(w io.Writer, raw json.RawMessage) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		fmt.Fprintln(w, "  -")
		return
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "  ", "  "); err != nil {
		fmt.Fprintf(w, "  %s\n", printable(string(raw)))
		return
	}
	fmt.Fprintf(w, "  %s\n", jsonEscaped(b.Bytes()))
}

// orDash is show(s), or "-" when s is empty.
func orDash(s string, show func(string) string) string {
	if s == "" {
		return "-"
	}
	return show(s)
}

func yesNo(v bool, yes string) string {
	if v {
		return yes
	}
	return "no"
}

// payloadPurgedAt returns when the row's payload was last purged, from its audit trail.
func payloadPurgedAt(audit []ops.AuditEntry) (time.Time, bool) {
	for i := len(audit) - 1; i >= 0; i-- {
		if audit[i].Action == ops.ActionPurgePayload {
			return audit[i].At, true
		}
	}
	return time.Time{}, false
}
