package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/config"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgcluster"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// demoTimeout bounds the whole demo, so it never hangs; it normally takes a few seconds.
const demoTimeout = 60 * time.Second

// demoSuccess is the demo's last line when everything ended as it should.
const demoSuccess = "every effect happened once; the permanent failure is dead with its reason"

func newDemoCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Watch the relay deliver a few intents, failures included, to a local receiver",
		Long: "demo shows outboxd end to end in a few seconds. It starts a throwaway PostgreSQL from the local " +
			"server binaries (or uses OUTBOX_DATABASE_URL), migrates it, starts a receiver on loopback that " +
			"enforces Idempotency-Key, runs the relay against it and commits five intents in one application " +
			"transaction: two that succeed at once, one whose receiver performs the effect and then drops the " +
			"connection before answering, one that fails twice before it succeeds, and one the receiver refuses " +
			"for good.\n\n" +
			"It prints each attempt as it happens and the end state, and exits 0 only when every delivered " +
			"intent had exactly one effect at the receiver and the refused one is dead with its reason. " +
			"It stops everything it started and removes the throwaway database. With OUTBOX_DATABASE_URL " +
			"(a scratch database is best), the demo's rows stay in that database under keys that start with " +
			"the run id it prints, for a relay instance of their own (webhook:demo_<run id>), so its relay " +
			"delivers no other row; it prints the DELETE that removes them. A demo stopped before they " +
			"finish cancels the ones left, which no relay would ever deliver.",
		Example: `  # a throwaway PostgreSQL from initdb and pg_ctl (on PATH or under /usr/lib/postgresql/*/bin)
  outboxd demo

  # the same, from a checkout
  make demo

  # an existing database: migrated, and the demo's five rows stay there
  OUTBOX_DATABASE_URL=postgres://app@localhost/app outboxd demo`,
		RunE: func(cmd *cobra.Command, _ []string) error { return demo(cmd.Context(), e) },
	}
}

// demoIntent is one of the demo's intents and what its receiver is told to do.
type demoIntent struct {
	key      string
	what     string // what the receiver does, for a person
	plan     receiver.Plan
	payload  map[string]any
	wantDead bool
}

// cleanStopSignals are the signals that stop a command that must clean up after itself
// (the demo's rows on a user's database, a throwaway cluster's directory) as Ctrl-C does.
// And SIGHUP, whose default ends the process as well, for a terminal that went away (its
// window closed, an SSH session dropped); unless it is ignored (nohup), which asking for
// it would undo. Not SIGPIPE: see ignoreBrokenPipes.
func cleanStopSignals() []os.Signal {
	stopSignals := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		stopSignals = append(stopSignals, syscall.SIGHUP)
	}
	return stopSignals
}

// ignoreBrokenPipes makes a write to a pipe whose reader went away fail with EPIPE, on
// every descriptor. Output read by a program that stops reading (`outboxd demo | head`,
// a pager quit early) breaks the pipe, and Go's default for a write to a broken standard
// output is to end the process there, leaving the demo's rows and a throwaway cluster's
// directory behind. Asking for the signal instead (signal.Notify) has Go deliver it for a
// broken write on any descriptor, a receiver's or the database's connection that closed
// under a write among them: the demo then stopped halfway with "broken pipe signal
// received", its output fine. Ignored, the write that fails says which it was; the demo
// stops when its own output fails (storyWriter).
func ignoreBrokenPipes() { signal.Ignore(syscall.SIGPIPE) }

// errOutputClosed stops a demo whose output can no longer be written.
var errOutputClosed = errors.New("its output was closed (broken pipe)")

// demo runs the demonstration; see newDemoCmd.
func demo(ctx context.Context, e *env) (err error) {
	logCfg, err := config.LoadLog(e.environ)
	if err != nil {
		return usageError{err}
	}
	// The demo's own lines tell the story; the relay's logs only show problems.
	logger := newLogger(e.stderr, config.Log{Format: logCfg.Format, Level: "warn"})

	ignoreBrokenPipes()
	ctx, stop := signal.NotifyContext(ctx, cleanStopSignals()...)
	defer stop()
	ctx, outputClosed := context.WithCancelCause(ctx)
	defer outputClosed(nil)
	ctx, cancel := context.WithTimeoutCause(ctx, demoTimeout,
		fmt.Errorf("the demo did not finish within %s", demoTimeout))
	defer cancel()

	out := newStoryWriter(e.stdout)
	out.closed = func() { outputClosed(errOutputClosed) }
	runID := randomHex(4)
	out.plain("outboxd demo (run %s): the relay delivers five intents to a local receiver that enforces Idempotency-Key.\n", runID)

	// The database: the given one, or a throwaway cluster.
	instance := "webhook"
	var dsn string
	db, given, err := config.LoadOptionalDatabase(e.environ)
	if err != nil {
		// Set but unusable: say so, as every other command does, rather than quietly
		// run somewhere else.
		return usageError{err}
	}
	if given {
		dsn = db.URL
		// A relay instance of its own, so the demo relay never claims the database's
		// other rows, and keys of its own.
		instance = "webhook:demo_" + runID
		out.plain("database: OUTBOX_DATABASE_URL (%s); the demo's rows use relay instance %s\n", db, instance)
	} else {
		if e.ownsProcess {
			// The environment is the process's: only for a process of its own.
			pgcluster.ClearClientEnvironment()
		}
		out.plain("database: starting a throwaway PostgreSQL from the local server binaries ...")
		started := time.Now()
		cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			out.plain("\n") // end the line above, which waited for "ready"
			if errors.Is(err, pgcluster.ErrNotFound) {
				return fmt.Errorf("%w; or set OUTBOX_DATABASE_URL to use an existing database", err)
			}
			return fmt.Errorf("start PostgreSQL: %w", err)
		}
		defer func() {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintln(e.stderr, "outboxd: stop the throwaway PostgreSQL:", err)
			}
		}()
		dsn = cluster.URL("postgres")
		out.plain(" ready on 127.0.0.1:%d after %s\n", cluster.Port(), time.Since(started).Round(10*time.Millisecond))
	}
	poolCfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return usageError{fmt.Errorf("OUTBOX_DATABASE_URL: %w", err)}
	}
	config.SessionDefaults(poolCfg)
	// A database that never answers fails the demo as it fails the other commands, with
	// a connect timeout that says so, not once demoTimeout is over with "context
	// deadline exceeded".
	boundConnect(poolCfg)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	from, err := outboxd.Migrate(ctx, pool)
	if err != nil {
		if ctx.Err() != nil {
			// Stopped (Ctrl-C, the time limit) while it migrated: say why, as at every
			// later step, not "context canceled". The migration is one transaction, so
			// nothing of it stays.
			err = context.Cause(ctx)
		}
		return fmt.Errorf("migrate: %w", err)
	}
	if from == outboxd.SchemaVersion {
		out.plain("schema: already at version %d\n", from)
	} else {
		out.plain("schema: migrated from version %d to %d\n", from, outboxd.SchemaVersion)
	}

	intents := demoIntents(runID)
	drops := make(map[string]bool, len(intents))
	for _, in := range intents {
		drops[in.key] = in.plan.DropAfterEffect > 0
		out.keyWidth = max(out.keyWidth, len(in.key))
	}
	enqueued := false // the application's transaction was sent, and may have committed
	if given {
		// On the user's database, a demo stopped before its rows finished (a signal, the
		// timeout) cancels the rest: no relay has its instance, so they would wait there
		// for good, and every relay would warn about them. This runs after the relay
		// stopped (deferred below), so none is in flight.
		defer func() {
			if err == nil || !enqueued {
				return
			}
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer ccancel()
			keys := make([]string, len(intents))
			for i, in := range intents {
				keys[i] = in.key
			}
			res, cerr := ops.Cancel(cctx, pool, keys, "outboxd demo", "the demo stopped before it finished", time.Time{})
			if cerr != nil {
				fmt.Fprintln(e.stderr, "outboxd: cancel the demo's unfinished rows:", cerr)
			} else if len(res.Canceled) > 0 {
				out.plain("\nthe demo stopped before its rows finished; canceled the %d still waiting, so no relay waits for them\n",
					len(res.Canceled))
			}
			if cerr == nil && len(res.NotFound) == len(keys) {
				return // its transaction never committed: no row of it is there
			}
			// Its rows stay all the same (the refused one dead, a dead letter in
			// `outboxd status`), as after a run that finished: say how to remove them.
			out.plain("\nthe demo's rows stay in this database for relay instance %s; remove them with:\n"+
				"  DELETE FROM outbox WHERE connector = '%s';  -- their attempts go with them\n", instance, instance)
		}()
	}
	// The receiver reports each effect as it performs it.
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(eff receiver.Effect) {
		note := ""
		if drops[eff.Key] {
			note = ", and now drops the connection without answering"
		}
		out.event(eff.Key, "receiver performed the effect (#%d at this receiver)%s", eff.Seq, note)
	}})
	if err != nil {
		return fmt.Errorf("start receiver: %w", err)
	}
	defer rcv.Close()
	for _, in := range intents {
		rcv.Plan(in.key, in.plan)
	}
	out.plain("receiver: %s (enforces Idempotency-Key: a repeated key gets the stored answer, no new effect)\n", rcv.URL())

	// The receiver answers at once; the time limit is for a machine so busy that it
	// does not (a build or a test suite beside it), where an attempt cut at 5 s told a
	// story of timeouts instead of the demo's.
	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced, Timeout: 20 * time.Second})
	if err != nil {
		return fmt.Errorf("webhook connector: %w", err)
	}
	relayCfg := &relay.Config{
		ID:           "demo-" + runID,
		PollInterval: 200 * time.Millisecond,
		BackoffBase:  200 * time.Millisecond,
		BackoffMax:   time.Second,
		// Far beyond the demo's few seconds: on a shared database, the demo relay must
		// not purge rows another relay keeps.
		Retention:       100 * 365 * 24 * time.Hour,
		ShutdownTimeout: 5 * time.Second,
		Logger:          logger,
	}
	r, err := relay.New(pool, relayCfg, map[string]relay.Instance{
		instance: {Connector: &watchedConnector{Connector: hook, rcv: rcv, out: out}},
	})
	if err != nil {
		return err
	}
	rr := startRelay(ctx, r)
	defer func() { _ = rr.stop() }()
	if err := rr.waitReady(ctx); err != nil {
		return err
	}
	out.plain("relay: running as %s (guarantee enforced, retries after 200ms, doubling, at most 1s apart)\n\n", r.ID())

	// The application's transaction: its own writes and the intents commit together.
	// Deliveries start the moment it commits, so the story is told first.
	out.plain("app: one transaction enqueues these intents (pgx.BeginFunc, outbox.Enqueue, commit);\n" +
		"     the times below count from its BEGIN:\n")
	for _, in := range intents {
		out.plain("  %-*s  %s\n", out.keyWidth, in.key, in.what)
	}
	out.plain("\n")
	out.start()
	enqueued = true
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the application's own UPDATE orders SET ... would go here ...
		for _, in := range intents {
			if _, err := outbox.Enqueue(ctx, tx, outbox.Message{Key: in.key, Connector: instance, Payload: in.payload}); err != nil {
				return err // a rollback removes the intents too
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			// Stopped (Ctrl-C, the time limit) while it enqueued, or while the COMMIT's
			// answer was on its way: say why, as below, not "context canceled".
			err = context.Cause(ctx)
		}
		return fmt.Errorf("enqueue: %w", err)
	}

	// Wait until every intent is finished: delivered or dead.
	final, err := waitFinished(ctx, pool, intents)
	if err != nil {
		return err
	}
	if err := rr.stop(); err != nil {
		return err // it starts "relay: " already
	}
	out.plain("\n")
	if err := demoReport(out, intents, final, rcv); err != nil {
		return err
	}
	if given {
		// The rows stay for the operator commands to show, but the dead one makes
		// `outboxd status` report a dead letter, and no command deletes a dead row.
		out.plain("the demo's %d rows stay in this database for relay instance %s; the refused one is dead, "+
			"so `outboxd status` reports a dead letter until they are removed:\n"+
			"  DELETE FROM outbox WHERE connector = '%s';  -- their attempts go with them\n\n",
			len(intents), instance, instance)
	}
	out.plain("%s\n", demoSuccess)
	return nil
}

// demoIntents are the demo's intents, keyed as an application would: by the work (the
// run, the order, the step), once per logical operation.
func demoIntents(runID string) []demoIntent {
	return []demoIntent{
		{
			key:     outbox.Key(runID, "order-1001", "send-receipt"),
			what:    "succeeds at once",
			payload: map[string]any{"event": "order.paid", "order": "1001", "action": "send-receipt"},
		},
		{
			key:     outbox.Key(runID, "order-1001", "notify-warehouse"),
			what:    "succeeds at once",
			payload: map[string]any{"event": "order.paid", "order": "1001", "action": "notify-warehouse"},
		},
		{
			key:     outbox.Key(runID, "order-1002", "charge-card"),
			what:    "the receiver performs the effect, then drops the connection before answering",
			plan:    receiver.Plan{DropAfterEffect: 1},
			payload: map[string]any{"event": "order.placed", "order": "1002", "action": "charge-card", "amount": 4200},
		},
		{
			key:     outbox.Key(runID, "order-1003", "sync-crm"),
			what:    "the receiver fails twice (503), then succeeds",
			plan:    receiver.Plan{FailFirst: 2},
			payload: map[string]any{"event": "order.paid", "order": "1003", "action": "sync-crm"},
		},
		{
			key:      outbox.Key(runID, "order-1004", "post-invoice"),
			what:     "the receiver refuses it for good (422)",
			plan:     receiver.Plan{PermanentStatus: 422},
			payload:  map[string]any{"event": "order.paid", "order": "1004", "action": "post-invoice"},
			wantDead: true,
		},
	}
}

// waitFinished polls the intents every 100ms until each is delivered or dead.
func waitFinished(ctx context.Context, pool *pgxpool.Pool, intents []demoIntent) ([]outbox.Intent, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		final := make([]outbox.Intent, len(intents))
		done := true
		for i, in := range intents {
			got, err := outbox.Get(ctx, pool, in.key)
			if err != nil {
				if ctx.Err() != nil {
					return nil, fmt.Errorf("waiting for the intents to finish: %w", context.Cause(ctx))
				}
				return nil, err
			}
			final[i] = got
			if got.Status != outbox.StatusDelivered && got.Status != outbox.StatusDead {
				done = false
			}
		}
		if done {
			return final, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the intents to finish: %w", context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// demoReport prints the end state and checks it; it returns an error when the demo did
// not end as it should, and otherwise leaves the success line to its caller.
func demoReport(out *storyWriter, intents []demoIntent, final []outbox.Intent, rcv *receiver.Receiver) error {
	var problems []string
	out.plain("end state:\n")
	tw := tabwriter.NewWriter(out.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  KEY\tSTATUS\tATTEMPTS\tEFFECTS AT RECEIVER\tLAST ERROR")
	for i, in := range intents {
		got := final[i]
		effects := rcv.Effects(in.key)
		lastErr := ""
		if got.Status == outbox.StatusDead {
			lastErr = got.LastError
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", in.key, got.Status, got.Attempts, effects, lastErr)

		switch {
		case in.wantDead && got.Status != outbox.StatusDead:
			problems = append(problems, fmt.Sprintf("%s should be dead, but is %s", in.key, got.Status))
		case in.wantDead && got.LastError == "":
			problems = append(problems, fmt.Sprintf("%s is dead without a reason in last_error", in.key))
		case in.wantDead && effects != 0:
			problems = append(problems, fmt.Sprintf("%s is dead, yet the receiver performed its effect %d times", in.key, effects))
		case !in.wantDead && got.Status != outbox.StatusDelivered:
			problems = append(problems, fmt.Sprintf("%s should be delivered, but is %s: %s", in.key, got.Status, got.LastError))
		case !in.wantDead && effects != 1:
			problems = append(problems, fmt.Sprintf("%s was delivered with %d effects at the receiver instead of exactly 1", in.key, effects))
		}
	}
	_ = tw.Flush()
	out.plain("\n")
	// The counts above are by the intents' keys, so an effect performed under any other
	// key (a retry that did not carry its intent's key: the duplicate the demo is there
	// to rule out) is not among them. The receiver is the demo's own, so every effect
	// it performed is one of this run's.
	want := 0
	for _, in := range intents {
		if !in.wantDead {
			want++
		}
	}
	if total := rcv.TotalEffects(); total != want {
		problems = append(problems, fmt.Sprintf("the receiver performed %d effects in all, for %d delivered intents: "+
			"some were performed under a key that is none of the intents'", total, want))
	}
	if len(problems) > 0 {
		for _, p := range problems {
			out.plain("PROBLEM: %s\n", p)
		}
		return fmt.Errorf("the demo did not end as it should: %d problem(s), listed above", len(problems))
	}
	return nil
}

// watchedConnector wraps the demo's webhook connector to print each attempt as it ends.
type watchedConnector struct {
	connectors.Connector
	rcv *receiver.Receiver
	out *storyWriter
}

// Deliver delivers through the wrapped connector and prints how the attempt ended.
func (w *watchedConnector) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	// Attempts of one row never overlap, so the count before and after tells whether
	// this attempt performed the effect.
	before := w.rcv.Effects(d.Key)
	res, err := w.Connector.Deliver(ctx, d)
	after := w.rcv.Effects(d.Key)
	var outcome string
	switch {
	case err == nil && after == before && after > 0:
		outcome = fmt.Sprintf("delivered (%s: the receiver answered from its stored result, no second effect)", resultStatus(res))
	case err == nil:
		outcome = fmt.Sprintf("delivered (%s)", resultStatus(res))
	case connectors.IsPermanent(err):
		outcome = "permanent failure, not retried: " + err.Error()
	case connectors.IsAmbiguous(err):
		outcome = "ambiguous (the receiver may have acted), will retry with the same key: " + err.Error()
	default:
		outcome = "failed, will retry with the same key: " + err.Error()
	}
	w.out.event(d.Key, "attempt %d %s", d.Attempt, outcome)
	return res, err
}

// resultStatus returns the status code in a webhook result, such as "200".
func resultStatus(res json.RawMessage) string {
	var r struct {
		Status int `json:"status"`
	}
	if json.Unmarshal(res, &r) != nil || r.Status == 0 {
		return "ok"
	}
	return fmt.Sprint(r.Status)
}

// storyWriter writes the demo's lines, from any goroutine, whole.
type storyWriter struct {
	mu       sync.Mutex
	w        io.Writer
	since    time.Time
	keyWidth int    // keys in event lines are padded to this width; set before any event
	closed   func() // if set, called when a write meets a pipe whose reader went away
}

// wrote calls s.closed when err says the output's reader went away. s.mu is held.
func (s *storyWriter) wrote(_ int, err error) {
	if errors.Is(err, syscall.EPIPE) && s.closed != nil {
		s.closed()
	}
}

func newStoryWriter(w io.Writer) *storyWriter { return &storyWriter{w: w, since: time.Now()} }

// start restarts the clock of event lines: time 0 is the application's BEGIN.
func (s *storyWriter) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since = time.Now()
}

// plain writes text as is.
func (s *storyWriter) plain(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wrote(fmt.Fprintf(s.w, format, args...))
}

// event writes one line about key, prefixed with the time since start.
func (s *storyWriter) event(key, format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	line := strings.TrimRight(fmt.Sprintf(format, args...), "\n")
	s.wrote(fmt.Fprintf(s.w, "%+7.3fs  %-*s  %s\n", time.Since(s.since).Seconds(), s.keyWidth, key, line))
}

// runningRelay is a relay running in a goroutine of its own.
type runningRelay struct {
	r      *relay.Relay
	cancel context.CancelFunc
	done   chan struct{} // closed once Run returned
	err    error         // what Run returned; read after done is closed
}

// startRelay runs r until stop is called or ctx ends.
func startRelay(ctx context.Context, r *relay.Relay) *runningRelay {
	ctx, cancel := context.WithCancel(ctx)
	rr := &runningRelay{r: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rr.done)
		rr.err = r.Run(ctx)
	}()
	return rr
}

// waitReady waits until the relay is ready: the database answers and it listens for
// NOTIFY, so rows committed from now on wake it at once.
func (rr *runningRelay) waitReady(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if rr.r.Ready(ctx) == nil {
			return nil
		}
		select {
		case <-rr.done:
			if rr.err != nil {
				return rr.err // it starts "relay: " already
			}
			return errors.New("relay stopped before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("waiting for the relay: %w", context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// stop stops the relay and waits until Run returned. Calling it again returns the same.
func (rr *runningRelay) stop() error {
	rr.cancel()
	<-rr.done
	return rr.err
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
