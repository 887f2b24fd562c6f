package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os/signal"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// replayConfirmAbove is how many rows replay changes without asking first.
const replayConfirmAbove = 10

// errUnconfirmed is a replay the operator did not confirm.
var errUnconfirmed = errors.New("replay not confirmed; nothing was changed")

func newReplayCmd(e *env) *cobra.Command {
	var (
		db     dbFlag
		f      filterFlags
		keys   []string
		o      ops.ReplayOptions
		yes    bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Put dead, held or stuck intents back to pending, keeping their key",
		Long: "replay puts the selected intents back to pending, so a relay attempts them again with the same " +
			"idempotency key. Select rows with --key (repeatable) or with list's filters, not both.\n\n" +
			"Pending rows are left unchanged; canceled, awaiting-approval and in-flight rows are refused, and so " +
			"are delivered rows unless --redeliver, after which replay says what the connector's receiver " +
			"guarantee means for a second send, as it does for rows an earlier attempt of which may have " +
			"reached the receiver (stuck, or held or dead after an ambiguous attempt). A row past its receiver's " +
			"key window (payment, email over Resend: 24 hours from its first attempt) is refused too, since a relay " +
			"would hold it again without sending it under a key the receiver has forgotten. --new-key re-executes " +
			"each row as a new intent under a derived key instead (never of a copy it made, whose original is " +
			"copied instead; once a copy was delivered, only with --redeliver). Changing more than 10 rows asks " +
			"first (refused without a terminal) unless --yes; " +
			"--dry-run shows what would happen and changes nothing. Each replayed row gets an audit entry " +
			"naming $USER and --reason.\n\n" +
			"Exits 1 when a key given with --key has no row or was refused, and, as grep does, when the filters " +
			"match no row; a filter's refusals are reported only.",
		Example: `  # what would replaying yesterday's dead webhook rows do?
  outboxd replay --status dead --connector webhook --newer-than 24h --dry-run

  # do it, 100 rows a second, without asking
  outboxd replay --status dead --connector webhook --newer-than 24h --rate 100 --yes --reason "receiver fixed"

  # send one delivered intent again
  outboxd replay --key order-42-confirmation --redeliver --reason "customer lost the email"`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := replaySelection(cmd, &f, keys)
			if err != nil {
				return err
			}
			if !(o.Rate >= 0) || math.IsInf(o.Rate, 1) { // NaN too, which caps nothing
				return usagef("--rate: %g is not a number of rows per second (0 for no cap)", o.Rate)
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
			dsn, _ := db.resolve(e)
			o.KeyWindowFunc = keyWindows(e.environ, dsn)
			return replay(ctx, e, pool, sel, o, replayRun{yes: yes, json: asJSON, dsn: dsn})
		},
	}
	db.register(cmd)
	fs := cmd.Flags()
	fs.StringArrayVar(&keys, "key", nil, "idempotency key of a row to replay (repeatable)")
	f.register(cmd, false, 0, "most rows to select with the filters, 1 or more (default: no cap)")
	fs.StringVar(&o.Reason, "reason", "", "why, for the audit trail")
	fs.BoolVar(&o.DryRun, "dry-run", false, "show what would happen and change nothing")
	fs.BoolVarP(&yes, "yes", "y", false, "replay more than 10 rows without asking")
	fs.BoolVar(&o.Redeliver, "redeliver", false, "also replay delivered rows, which sends them again")
	fs.BoolVar(&o.NewKey, "new-key", false, "re-execute each row as a new intent under a derived key, leaving the row alone")
	fs.Float64Var(&o.Rate, "rate", 0, "most rows replayed per second (default: no cap)")
	fs.IntVar(&o.BatchSize, "batch-size", 0, "rows per transaction (default 500)")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// replaySelection builds the selection from --key or the filters.
func replaySelection(cmd *cobra.Command, f *filterFlags, keys []string) (ops.Selection, error) {
	byFilter := f.set(cmd)
	switch {
	case len(keys) > 0 && (byFilter || cmd.Flags().Changed("limit")):
		return ops.Selection{}, usagef("select rows with --key or with filters, not both")
	case len(keys) > 0:
		return ops.Selection{Keys: keys}, nil
	case !byFilter:
		return ops.Selection{}, usagef("say which rows to replay: --key KEY, or filters such as --status dead")
	}
	filter, err := f.filter(cmd)
	if err != nil {
		return ops.Selection{}, err
	}
	return ops.Selection{Filter: &filter}, nil
}

type replayRun struct {
	yes, json bool
	dsn       string
}

func replay(ctx context.Context, e *env, pool *pgxpool.Pool, sel ops.Selection, o ops.ReplayOptions, run replayRun) error {
	g := guarantees(e, run.dsn)
	// A dry run first: it says how many rows would change, which decides whether to ask,
	// and with --dry-run it is the answer.
	dry := o
	dry.DryRun, dry.Rate, dry.ProgressFunc = true, 0, nil
	plan, err := ops.Replay(ctx, pool, sel, dry)
	if err != nil {
		return opsError(err)
	}
	if sel.Filter != nil && len(planKeys(plan)) == 0 {
		if run.json {
			// As list does: an empty result, then the failure a script can test for.
			plan.DryRun = o.DryRun
			if err := writeJSON(e.stdout, replayJSON{ReplayResult: plan}); err != nil {
				return err
			}
		}
		return errNoMatch
	}
	var notes []string
	if o.Redeliver {
		if notes, err = redeliveryNotes(ctx, pool, sel, plan.Replayed, g, o.NewKey); err != nil {
			return err
		}
	}
	if o.DryRun {
		return reportReplay(e, plan, notes, ambiguousNotes(plan, g, o.NewKey), sel, run.json)
	}
	if len(plan.Replayed) > replayConfirmAbove && !run.yes {
		all := slices.Concat(notes, ambiguousNotes(plan, g, o.NewKey))
		if err := confirmReplay(e, len(plan.Replayed), all); err != nil {
			return err
		}
	}
	// The real run takes only the rows the plan would replay, so what was confirmed is
	// what changes: a row the plan left alone may have changed while the operator read
	// the prompt (one pending or in flight then, delivered since, which --redeliver would
	// send again; one gone dead since), and it is reported as the plan found it. Each row
	// is decided again under its lock, so one the plan would replay may still be left.
	orig := sel
	sel = ops.Selection{Keys: plan.Replayed}
	if orig.Filter != nil {
		// Still in the statuses the filter selected them for: a row a relay delivered
		// meanwhile (a late delivery of a dead row's ambiguous attempt) is not what was
		// confirmed, and --redeliver would send it again.
		sel.Statuses = orig.Filter.Status
	}
	if len(sel.Keys) == 0 {
		plan.DryRun = false
		return reportReplay(e, plan, notes, nil, orig, run.json)
	}
	if !run.json && stderrTerminal(e.stderr) {
		bar := newProgressBar(e.stderr, "replaying")
		o.ProgressFunc = bar.set
		defer bar.done()
	}
	// SIGINT or SIGTERM (or ctx ending) stops a replay between batches: the batch under
	// way commits, and what was replayed is reported as at the end. Go's default killed
	// it without a word, after a paced replay had run for minutes. A second signal
	// has the default again.
	stopCtx, stop := signal.NotifyContext(ctx, cleanStopSignals()...)
	defer stop()
	context.AfterFunc(stopCtx, stop)
	o.Stop = stopCtx.Done()
	res, err := ops.Replay(context.WithoutCancel(ctx), pool, sel, o)
	res = leftAloneByPlan(res, plan)
	anotes := ambiguousNotes(res, g, o.NewKey)
	if errors.Is(err, ops.ErrReplayStopped) {
		if err := reportReplay(e, res, notes, anotes, orig, run.json); err != nil {
			return err
		}
		return fmt.Errorf("replay interrupted: %d rows not reached were left as they were; run it again to replay them",
			notReached(res, sel.Keys))
	}
	if err != nil {
		// Earlier batches are committed; show them with the error.
		_ = reportReplay(e, res, notes, anotes, orig, run.json)
		return opsError(err)
	}
	return reportReplay(e, res, notes, anotes, orig, run.json)
}

// notReached counts the keys a replay stopped between batches never looked at.
func notReached(res ops.ReplayResult, keys []string) int {
	seen := map[string]bool{}
	for _, k := range slices.Concat(res.Replayed, res.Unchanged, res.NotFound) {
		seen[k] = true
	}
	for k := range res.Refused {
		seen[k] = true
	}
	n := 0
	for _, k := range keys {
		if !seen[k] {
			n++
		}
	}
	return n
}

// leftAloneByPlan adds to res, the run of the rows plan would replay, the rows plan left
// alone (unchanged, refused, not found), as plan found them, with the copies that name
// why a --new-key row was unchanged.
func leftAloneByPlan(res, plan ops.ReplayResult) ops.ReplayResult {
	res.Unchanged = append(append([]string{}, plan.Unchanged...), res.Unchanged...)
	res.NotFound = append(append([]string{}, plan.NotFound...), res.NotFound...)
	for k, why := range plan.Refused {
		res.Refused[k] = why
	}
	if res.NewKeys != nil {
		for _, k := range plan.Unchanged {
			if nk, ok := plan.NewKeys[k]; ok {
				res.NewKeys[k] = nk
			}
		}
	}
	return res
}

// planKeys returns every key a dry run looked at, in a stable order.
func planKeys(p ops.ReplayResult) []string {
	keys := append(append([]string{}, p.Replayed...), p.Unchanged...)
	return append(keys, sortedKeys(p.Refused)...)
}

// confirmReplay asks on the terminal before replaying n rows; without a terminal it
// refuses.
func confirmReplay(e *env, n int, notes []string) error {
	if !stdinTerminal(e.stdin) {
		return fmt.Errorf("replay would change %d rows (more than %d) and stdin is not a terminal to ask on; "+
			"run it with --dry-run to see them, then pass --yes to confirm", n, replayConfirmAbove)
	}
	for _, n := range notes {
		fmt.Fprintln(e.stderr, n)
	}
	fmt.Fprintf(e.stderr, "Replay %d rows? [y/N] ", n)
	line, err := bufio.NewReader(e.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read answer: %w", err)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	if errors.Is(err, io.EOF) {
		fmt.Fprintln(e.stderr)
		return fmt.Errorf("%w (no answer; pass --yes to replay without asking)", errUnconfirmed)
	}
	return errUnconfirmed
}

// redeliveryNotes returns a GuaranteeNote per connector with delivered rows in the
// selection that the replay's plan sends (planned, its keys): what sending them again
// means. A delivered row it refuses (its payload purged, its key window past, a live
// lease) is not sent, and its connector was explained all the same. With newKey they go
// out under a new key, which no receiver has seen, whatever its guarantee.
func redeliveryNotes(ctx context.Context, pool *pgxpool.Pool, sel ops.Selection, planned []string, g guaranteeSet,
	newKey bool) ([]string, error) {
	sent := make(map[string]bool, len(planned))
	for _, k := range planned {
		sent[k] = true
	}
	seen := map[string]bool{}
	if sel.Filter == nil {
		for _, k := range sel.Keys {
			if !sent[k] {
				continue
			}
			in, err := outbox.Get(ctx, pool, k)
			if errors.Is(err, outbox.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if in.Status == outbox.StatusDelivered {
				seen[in.Connector] = true
			}
		}
	} else {
		f := *sel.Filter
		if len(f.Status) > 0 && !slices.Contains(f.Status, outbox.StatusDelivered) {
			return nil, nil
		}
		// A limit selects the newest rows whatever their status, as the replay does;
		// without one, every delivered row the filters match is selected.
		capped, n := f.Limit, 0
		if capped == 0 {
			f.Status = []string{outbox.StatusDelivered}
		}
		f.After = ""
		for {
			f.Limit = 1000
			if capped > 0 {
				f.Limit = min(1000, capped-n)
			}
			page, err := ops.List(ctx, pool, f)
			if err != nil {
				return nil, opsError(err)
			}
			for _, in := range page.Intents {
				if in.Status == outbox.StatusDelivered && sent[in.Key] {
					seen[in.Connector] = true
				}
			}
			n += len(page.Intents)
			if page.Next == "" || (capped > 0 && n >= capped) {
				break
			}
			f.After = page.Next
		}
	}
	return guaranteeNotes(sortedKeys(seen), g, newKey), nil
}

// ambiguousNotes returns a GuaranteeNote per connector of the replayed rows an earlier
// attempt of which may have reached the receiver (ops.ReplayResult.Ambiguous, key to
// connector): what sending them again means, as for delivered rows. A row there because
// a copy that --new-key made may have acted (ops.ReplayResult.AmbiguousByCopy) goes out
// under a key the receiver did not see that attempt carry, and is explained as a new key.
func ambiguousNotes(res ops.ReplayResult, g guaranteeSet, newKey bool) []string {
	copied := make(map[string]bool, len(res.AmbiguousByCopy))
	for _, k := range res.AmbiguousByCopy {
		copied[k] = true
	}
	seen, byCopy := map[string]bool{}, map[string]bool{}
	for k, c := range res.Ambiguous {
		if copied[k] {
			byCopy[c] = true
		} else {
			seen[c] = true
		}
	}
	return append(guaranteeNotes(sortedKeys(seen), g, newKey), guaranteeNotes(sortedKeys(byCopy), g, true)...)
}

// guaranteeNotes says, for each connector of names, what sending a row again means
// under its guarantee; with newKey the row goes out under a new key, which no receiver
// has seen.
func guaranteeNotes(names []string, g guaranteeSet, newKey bool) []string {
	var notes []string
	for _, c := range names {
		gu, ok := g.of[c]
		if newKey {
			known := string(gu)
			if !ok {
				known = "unknown here"
			}
			notes = append(notes, fmt.Sprintf("%s: a new key, so the receiver acts again whatever its guarantee (%s)", c, known))
			continue
		}
		if !ok {
			notes = append(notes, fmt.Sprintf("%s: guarantee unknown here (%s): "+
				"assume the receiver may act twice", c, g.unknownWhy))
			continue
		}
		notes = append(notes, fmt.Sprintf("%s: %s", c, ops.GuaranteeNote(gu)))
	}
	return notes
}

type replayJSON struct {
	ops.ReplayResult
	GuaranteeNotes []string `json:"guarantee_notes,omitempty"`
	// AmbiguousNotes explain the guarantees of the rows in Ambiguous.
	AmbiguousNotes []string `json:"ambiguous_notes,omitempty"`
}

// reportReplay prints the result, and fails when a key named with --key was not
// replayed (no row, or refused). notes explain the redelivered rows' guarantees, and
// anotes those of the rows an earlier attempt of which may have reached the receiver.
func reportReplay(e *env, res ops.ReplayResult, notes, anotes []string, sel ops.Selection, asJSON bool) error {
	if asJSON {
		if err := writeJSON(e.stdout, replayJSON{ReplayResult: res, GuaranteeNotes: notes, AmbiguousNotes: anotes}); err != nil {
			return err
		}
	} else {
		w := e.stdout
		verb := "replayed"
		if res.DryRun {
			fmt.Fprintln(w, "dry run: nothing was changed")
			verb = "would replay"
		}
		fmt.Fprintf(w, "%s: %d\n", verb, len(res.Replayed))
		for _, k := range res.Replayed {
			if nk, ok := res.NewKeys[k]; ok {
				fmt.Fprintf(w, "  %s -> %s\n", keyText(k), keyText(nk))
			} else {
				fmt.Fprintf(w, "  %s\n", keyText(k))
			}
		}
		writeLeftAlone(w, res.Unchanged, func(k string) string {
			if nk, ok := res.NewKeys[k]; ok { // --new-key: the row is as it was, its copy not finished
				return fmt.Sprintf("its copy %s is still on its way", keyText(nk))
			}
			return "already pending"
		}, res.Refused, res.NotFound)
		if len(notes) > 0 {
			fmt.Fprintln(w, "redelivering sends delivered rows again:")
			for _, n := range notes {
				fmt.Fprintf(w, "  %s\n", n)
			}
		}
		if len(anotes) > 0 {
			fmt.Fprintln(w, "replaying sends again rows an earlier attempt of which may have reached the receiver:")
			for _, n := range anotes {
				fmt.Fprintf(w, "  %s\n", n)
			}
		}
	}
	if sel.Filter != nil {
		return nil
	}
	return keysLeftError("replayed", res.NotFound, res.Refused)
}
