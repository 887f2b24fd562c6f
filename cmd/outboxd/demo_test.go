package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgcluster"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// TestDemo runs `outboxd demo` end to end, as the README's first command does: a
// throwaway PostgreSQL, the relay and a receiver, a few seconds.
func TestDemo(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		environ []string
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		if _, err := pgcluster.FindBinDir(); err != nil {
			t.Fatalf("the demo needs the PostgreSQL server binaries (apt-get install postgresql): %v", err)
		}
		return &testBundle{}
	}
	check := func(t *testing.T, environ []string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), []string{"demo"}, environ, strings.NewReader(""), &stdout, &stderr)
		out := stdout.String()
		require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, stderr.String())

		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Equal(t, demoSuccess, lines[len(lines)-1], "the success line comes last")
		// Each attempt is printed as it happens: the dropped connection, its retry that
		// gets the stored answer, the two 503s, the permanent refusal.
		require.Contains(t, out, "attempt 1 ambiguous (the receiver may have acted), will retry with the same key")
		require.Contains(t, out, "attempt 2 delivered (200: the receiver answered from its stored result, no second effect)")
		require.Contains(t, out, "attempt 2 failed, will retry with the same key")
		require.Contains(t, out, "attempt 3 delivered (200)")
		// The end state: the dead row with its reason.
		var dead string
		for _, l := range lines {
			if strings.Contains(l, "/order-1004/post-invoice~") && strings.Contains(l, " dead ") {
				dead = l
			}
		}
		require.NotEmpty(t, dead, "the end state lists the dead row:\n%s", out)
		require.Contains(t, dead, "receiver answered 422 Unprocessable Entity")
		require.Contains(t, dead, "(permanent: not retried)")
		require.NotContains(t, out, "PROBLEM")
		return out
	}

	t.Run("ThrowawayCluster", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		out := check(t, b.environ)
		require.Contains(t, out, "database: starting a throwaway PostgreSQL")
	})

	t.Run("DatabaseURL", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cluster, err := pgcluster.Start(t.Context(), pgcluster.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, cluster.Stop()) })
		b.environ = []string{"OUTBOX_DATABASE_URL=" + cluster.URL("postgres")}

		out := check(t, b.environ)
		require.Contains(t, out, "database: OUTBOX_DATABASE_URL (")
		require.Contains(t, out, "relay instance webhook:demo_")

		// A second run in the same database keeps to its own rows.
		check(t, b.environ)
	})
}

// TestDemoLeavesNothingBehind runs `outboxd demo` to its end as a process, as `make
// demo` does, and checks that it stopped and removed the throwaway PostgreSQL it started:
// no server left running, no cluster directory left in its TMPDIR. (TestDemo runs the
// demo inside the test binary, whose TMPDIR holds the test clusters too; TestDemoCtrlC
// checks the same after an interrupt, not after a run that finished.)
func TestDemoLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("the demo needs the PostgreSQL server binaries (apt-get install postgresql): %v", err)
	}
	c := startChild(t, "demo")
	select {
	case <-c.exited:
	case <-time.After(processWait):
		t.Fatalf("the demo did not finish within %s", processWait)
	}
	require.Equal(t, exitOK, c.cmd.ProcessState.ExitCode())
	require.Contains(t, c.stdout.String(), "database: starting a throwaway PostgreSQL")
	require.Contains(t, c.stdout.String(), demoSuccess)
	c.requireNothingLeft(t)
}

// TestDemoReportCountsEveryEffect: the demo's end state says every effect happened once.
// Counted key by key only, an effect performed under another key (a retry that did not
// carry the intent's key, which is the duplicate the demo is there to rule out) was not
// counted at all, and the demo printed its success line over it. Here each delivered
// intent had its one effect, and the dropped one's retry made a second effect under
// another key.
func TestDemoReportCountsEveryEffect(t *testing.T) {
	t.Parallel()
	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	post := func(key string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, rcv.URL(), strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}

	intents := demoIntents("run")
	final := make([]outbox.Intent, len(intents))
	for i, in := range intents {
		final[i] = outbox.Intent{Key: in.key, Status: outbox.StatusDelivered, Attempts: 1}
		if in.wantDead {
			final[i].Status, final[i].LastError = outbox.StatusDead, "refused"
			continue
		}
		post(in.key)
	}
	var out bytes.Buffer
	require.NoError(t, demoReport(newStoryWriter(&out), intents, final, rcv), "one effect an intent: %s", &out)

	post(intents[2].key + "-retry") // the dropped intent's retry, under a key of its own
	out.Reset()
	require.Error(t, demoReport(newStoryWriter(&out), intents, final, rcv), "a second effect, under another key:\n%s", &out)
	require.Contains(t, out.String(), "PROBLEM: the receiver performed 5 effects in all")
}

func TestDemoHelp(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"demo", "--help"}, nil, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "Examples:\n")
	require.Contains(t, stdout.String(), "  outboxd demo\n")
}

// TestDemoRefusesInvalidDatabaseURL: a mistyped OUTBOX_DATABASE_URL is a usage error, as
// in every other command, not a reason to quietly run on a throwaway cluster instead.
func TestDemoRefusesInvalidDatabaseURL(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"demo"}, []string{"OUTBOX_DATABASE_URL=postgres://app@localhost:54x32/app"},
		strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.NotContains(t, stdout.String(), "throwaway")
	require.Contains(t, stderr.String(), "OUTBOX_DATABASE_URL")
}

// TestDemoGivesUpOnADatabaseThatDoesNotAnswer: on a database that accepts connections
// and never answers, the demo fails after opsConnectTimeout with pgx's connect timeout,
// as every other command does. It waited out its whole demoTimeout (a minute) and then
// said only "migrate: context deadline exceeded".
func TestDemoGivesUpOnADatabaseThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*opsConnectTimeout) // a bound for the test only
	defer cancel()

	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"demo"}, []string{"OUTBOX_DATABASE_URL=postgres://app:hunter2@" + pgtest.UnansweringAddr(t) + "/app"},
		strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitFailure, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.NoError(t, ctx.Err(), "the demo ended by itself")
	require.Contains(t, stderr.String(), "failed to connect")
	require.Contains(t, stderr.String(), "timeout")
	require.NotContains(t, stdout.String()+stderr.String(), "hunter2")
}

// TestDemoSaysWhatItDidToTheSchema: on a user's database at an older schema version, the
// demo upgrades it; it must say so, as `outboxd migrate` does.
func TestDemoSaysWhatItDidToTheSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	dsn := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	v3, err := os.ReadFile("../../testdata/schema_v3.sql")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, string(v3))
	require.NoError(t, err)

	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"demo"}, []string{"OUTBOX_DATABASE_URL=" + dsn}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Contains(t, stdout.String(), fmt.Sprintf("from version 3 to %d", outboxd.SchemaVersion), "the demo upgraded the user's schema:\n%s", stdout.String())

	// A second run finds it current and says so.
	stdout.Reset()
	code = run(ctx, []string{"demo"}, []string{"OUTBOX_DATABASE_URL=" + dsn}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Contains(t, stdout.String(), fmt.Sprintf("already at version %d", outboxd.SchemaVersion))

	// The closing line's DELETE removes the run's rows and their attempts, so the
	// dead one no longer counts as a dead letter.
	_, sql, ok := strings.Cut(stdout.String(), "until they are removed:\n")
	require.True(t, ok, stdout.String())
	sql, _, _ = strings.Cut(strings.TrimSpace(sql), "  --")
	var before, attempts int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&before))
	_, err = conn.Exec(ctx, sql)
	require.NoError(t, err)
	var after int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&after))
	require.Equal(t, len(demoIntents("x")), before-after, "the DELETE removes one run's rows")
	require.NoError(t, conn.QueryRow(ctx,
		`SELECT count(*) FROM outbox_attempts a WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = a.outbox_id)`).Scan(&attempts))
	require.Zero(t, attempts, "attempts of deleted rows are left")
}

// cancelOnWriter collects output and cancels once it has seen marker.
type cancelOnWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	marker string
	cancel context.CancelFunc
}

func (w *cancelOnWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.marker) {
		w.cancel()
	}
	return n, err
}

func (w *cancelOnWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestDemoInterruptedLeavesNoPendingRows: a demo stopped (Ctrl-C, or its timeout) on a
// user's database must not leave pending rows under its own relay instance, which no
// relay will ever have: every relay on that database would warn about them every 10
// seconds, forever.
func TestDemoInterruptedLeavesNoPendingRows(t *testing.T) {
	t.Parallel()

	dsn := pgtest.URL(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The first 503 of the row that fails twice: it is pending, its retry 200ms away.
	stdout := &cancelOnWriter{marker: "attempt 1 failed", cancel: cancel}
	var stderr bytes.Buffer
	code := run(ctx, []string{"demo"}, []string{"OUTBOX_DATABASE_URL=" + dsn}, strings.NewReader(""), stdout, &stderr)
	require.Equal(t, exitFailure, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())

	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(t.Context())) })
	var unfinished int
	require.NoError(t, conn.QueryRow(t.Context(),
		`SELECT count(*) FROM outbox WHERE status NOT IN ('delivered', 'dead', 'canceled')`).Scan(&unfinished))
	require.Zero(t, unfinished, "rows left waiting for a relay instance that no relay has\nstdout:\n%s\nstderr:\n%s",
		stdout.String(), stderr.String())
}

// TestDemoStoppedWhileEnqueueingSaysWhy: a demo stopped (Ctrl-C, its time limit) while
// its transaction enqueues said "outboxd: enqueue: context canceled", not why it
// stopped, as it does once the rows are enqueued. TestDemoCtrlC met it on a busy
// machine: its SIGINT, sent once the relay had printed attempts of the committed rows,
// came while the demo still waited for its COMMIT's answer. Here the enqueue waits for
// a lock on the table when the demo is stopped.
func TestDemoStoppedWhileEnqueueingSaysWhy(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	lock, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = lock.Exec(t.Context(), `LOCK TABLE outbox IN SHARE MODE`) // inserts wait
	require.NoError(t, err)

	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	var stdout, stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"demo"}, []string{"OUTBOX_DATABASE_URL=" + pool.Config().ConnString()},
			strings.NewReader(""), &stdout, &stderr)
	}()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO outbox (%'`).Scan(&n)
		return err == nil && n > 0
	}, time.Minute, 10*time.Millisecond, "the demo's enqueue never waited for the lock\nstdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	cancel(errors.New("interrupt signal received"))
	require.NoError(t, lock.Rollback(t.Context())) // the demo cancels what it enqueued, if anything
	select {
	case c := <-code:
		require.Equal(t, exitFailure, c, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	case <-time.After(time.Minute):
		t.Fatal("the demo did not stop")
	}
	// The relay may have logged its claims waiting for the lock too: the demo's own error comes last.
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	require.Equal(t, "outboxd: enqueue: interrupt signal received", lines[len(lines)-1], stderr.String())
}

// TestDemoStoppedWhileMigratingSaysWhy: a demo stopped (Ctrl-C, its time limit) while it
// migrates the database must say why it stopped, as it does at every later step, not
// "migrate: ...: context canceled". Here the migration waits for a lock on the schema's
// version table when the demo is stopped.
func TestDemoStoppedWhileMigratingSaysWhy(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	lock, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = lock.Exec(t.Context(), `LOCK TABLE outbox_schema_migrations IN ACCESS EXCLUSIVE MODE`) // reads wait
	require.NoError(t, err)

	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	var stdout, stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"demo"}, []string{"OUTBOX_DATABASE_URL=" + pool.Config().ConnString()},
			strings.NewReader(""), &stdout, &stderr)
	}()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM %outbox_schema_migrations%'`).Scan(&n)
		return err == nil && n > 0
	}, time.Minute, 10*time.Millisecond, "the demo's migration never waited for the lock\nstdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	cancel(errors.New("interrupt signal received"))
	select {
	case c := <-code:
		require.Equal(t, exitFailure, c, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	case <-time.After(time.Minute):
		t.Fatal("the demo did not stop")
	}
	require.Equal(t, "outboxd: migrate: interrupt signal received", strings.TrimSpace(stderr.String()))
}

// TestDemoWhoseOutputIsClosedStopsInOrder: a demo whose output goes to a reader that
// stops reading (`outboxd demo | head`, a pager quit early) gets SIGPIPE at its next
// line, which by Go's default ends the process on the spot: on a user's database its
// rows were left delivering or pending for a relay instance that no relay has (and a
// throwaway cluster's directory left behind). It must stop as a Ctrl-C stops it. The
// reader goes once the intents are enqueued, so that the retries' lines at least come
// after it.
func TestDemoWhoseOutputIsClosedStopsInOrder(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	requireDemoStopsInOrder(t, func(c *childProcess) {
		c.cmd.Stdout = w
		c.start(t)
		require.NoError(t, w.Close()) // the child holds the only write end
	}, func(*childProcess) {
		require.NoError(t, r.Close()) // the reader is gone
	}, "its output was closed (broken pipe)")
}

// TestDemoHungUpStopsInOrder: a demo whose terminal goes away (its window closed, an
// SSH session dropped) gets SIGHUP, which by Go's default ends the process on the spot:
// on a user's database its rows were left delivering or pending for a relay instance
// that no relay has. It must stop as a Ctrl-C stops it.
func TestDemoHungUpStopsInOrder(t *testing.T) {
	t.Parallel()
	requireDemoStopsInOrder(t, func(c *childProcess) { c.start(t) }, func(c *childProcess) {
		require.NoError(t, syscall.Kill(-c.cmd.Process.Pid, syscall.SIGHUP))
	}, "hangup signal received")
}

// requireDemoStopsInOrder runs a demo (started by start from newChild) on a test
// database, stops it (stop) once it has enqueued its intents, and checks that it stopped
// as a Ctrl-C stops it: no row left unfinished, not killed by a signal, exitFailure, and
// stderr saying why (want). The outcomes of the first attempts wait for a lock until it
// is stopped, so the demo cannot finish first.
func requireDemoStopsInOrder(t *testing.T, start, stop func(c *childProcess), want string) {
	t.Helper()
	pool := pgtest.DB(t)
	lock, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = lock.Exec(t.Context(), `LOCK TABLE outbox_attempts IN EXCLUSIVE MODE`) // outcomes wait
	require.NoError(t, err)

	c := newChild(t, "demo", "OUTBOX_DATABASE_URL="+pool.Config().ConnString())
	start(c)
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n)
		return err == nil && n == len(demoIntents("x"))
	}, processWait, 10*time.Millisecond, "the demo never enqueued its intents\nstderr:\n%s", c.stderr)
	stop(c)
	require.NoError(t, lock.Rollback(t.Context()))
	select {
	case <-c.exited:
	case <-time.After(processWait):
		t.Fatalf("the demo did not stop within %s", processWait)
	}

	var unfinished int
	require.NoError(t, pool.QueryRow(t.Context(),
		`SELECT count(*) FROM outbox WHERE status NOT IN ('delivered', 'dead', 'canceled')`).Scan(&unfinished))
	require.Zero(t, unfinished, "rows left waiting for a relay instance that no relay has (the demo: %v)", c.cmd.ProcessState)
	status := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.False(t, status.Signaled(), "the demo died of %v", status.Signal())
	require.Equal(t, exitFailure, status.ExitStatus())
	require.Contains(t, c.stderr.String(), want)
}

// TestDemoGoesOnWhenAnotherPipeBreaks: a write to a pipe or socket whose reader went away
// anywhere in the process, such as a receiver's connection that closed under the relay's
// request, is none of the demo's output. The demo asked for SIGPIPE to stop on its
// output's, and Go then delivers the signal for every descriptor's: the demo stopped
// halfway, "broken pipe signal received", its output fine.
func TestDemoGoesOnWhenAnotherPipeBreaks(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	stdout := &untilWriter{seen: make(chan struct{})}
	var stderr bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run(t.Context(), []string{"demo"}, []string{"OUTBOX_DATABASE_URL=" + pool.Config().ConnString()},
			strings.NewReader(""), stdout, &stderr)
	}()
	select {
	case <-stdout.seen:
	case <-time.After(processWait):
		t.Fatal("the demo wrote nothing")
	}
	r, w, err := os.Pipe()
	require.NoError(t, err)
	require.NoError(t, r.Close())
	_, err = w.Write([]byte("x"))
	require.ErrorIs(t, err, syscall.EPIPE)
	require.NoError(t, w.Close())
	select {
	case c := <-code:
		require.Equal(t, exitOK, c, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	case <-time.After(processWait):
		t.Fatal("the demo did not finish")
	}
}

// TestDemoIgnoresTheClientEnvironment: `make demo` needs no configuration, and its
// throwaway PostgreSQL is its own, so the libpq variables a user keeps for psql and
// their own databases must not reach its connections. pgx reads them (PGSERVICE,
// PGOPTIONS, PGREQUIREAUTH, PGTARGETSESSIONATTRS, ...) under the cluster's URL: with a
// read-only PGOPTIONS the migration failed, and with a PGSERVICE that pgx cannot find
// (libpq also reads the system's pg_service.conf, pgx only ~/.pg_service.conf) the demo
// waited 30 s and said "postgres did not accept connections within 30s".
func TestDemoIgnoresTheClientEnvironment(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("the demo needs the PostgreSQL server binaries (apt-get install postgresql): %v", err)
	}
	for name, kv := range map[string]string{
		"PGOPTIONS": "PGOPTIONS=-c default_transaction_read_only=on",
		"PGSERVICE": "PGSERVICE=outboxd_review_no_such_service",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := startChild(t, "demo", kv)
			select {
			case <-c.exited:
			case <-time.After(processWait):
				t.Fatalf("the demo did not finish within %s", processWait)
			}
			require.Equal(t, exitOK, c.cmd.ProcessState.ExitCode(), "stdout:\n%s\nstderr:\n%s", c.stdout, c.stderr)
			require.Contains(t, c.stdout.String(), demoSuccess)
			c.requireNothingLeft(t)
		})
	}
}

// TestDemoStoppedOnADatabaseSaysHowToRemoveItsRows: on a user's database the demo's
// rows stay, and the README says the demo prints the DELETE that removes them. A demo
// stopped early (Ctrl-C, its time limit) leaves them too (delivered, canceled, and the
// refused one dead, a dead letter in `outboxd status`), but printed the DELETE only on
// success.
func TestDemoStoppedOnADatabaseSaysHowToRemoveItsRows(t *testing.T) {
	t.Parallel()

	dsn := pgtest.URL(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The refused row is dead by now, and the row that fails twice has retries to go.
	stdout := &cancelOnWriter{marker: "attempt 1 failed", cancel: cancel}
	var stderr strings.Builder
	code := run(ctx, []string{"demo"}, []string{"OUTBOX_DATABASE_URL=" + dsn}, strings.NewReader(""), stdout, &stderr)
	require.Equal(t, exitFailure, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())

	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(t.Context())) })
	var left int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&left))
	require.Equal(t, len(demoIntents("x")), left, "the stopped demo's rows stay")

	i := strings.Index(stdout.String(), "DELETE FROM outbox WHERE connector = 'webhook:demo_")
	require.GreaterOrEqual(t, i, 0, "the stopped demo left its rows without saying how to remove them:\n%s", stdout.String())
	sql, _, _ := strings.Cut(stdout.String()[i:], ";")
	_, err = conn.Exec(t.Context(), sql)
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&left))
	require.Zero(t, left, "the printed DELETE removes the run's rows")
}
