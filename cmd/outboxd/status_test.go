package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// TestStatusGolden pins the table's layout on a fixed report.
func TestStatusGolden(t *testing.T) {
	t.Parallel()
	rep := ops.Report{
		Now:     time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC),
		Verdict: ops.VerdictStuck,
		Connectors: []ops.ConnectorStatus{
			{
				Connector: "email", Counts: ops.Counts{Pending: 2, Delivered: 1200},
				OldestPendingAge: 1500 * time.Millisecond, Verdict: ops.VerdictHealthy,
			},
			{
				Connector: "slack", Counts: ops.Counts{Delivered: 7, Dead: 1},
				DeadLastHour: 0, DeadLastDay: 1, Verdict: ops.VerdictDead,
			},
			{
				Connector: "webhook", Counts: ops.Counts{Pending: 31, Delivering: 4, Delivered: 98765, Dead: 3,
					Canceled: 2, AwaitingApproval: 1, Held: 1},
				OldestPendingAge: 3*time.Hour + 25*time.Minute + 9*time.Second, OldestDueWait: 2 * time.Minute,
				Stuck: 2, Ambiguous: 3, DeadLastHour: 1, DeadLastDay: 3, Verdict: ops.VerdictStuck,
			},
		},
	}
	g := map[string]connectors.Guarantee{"webhook": connectors.Enforced, "email": connectors.Forwarded}
	var b bytes.Buffer
	require.NoError(t, writeStatus(&b, rep, g))
	golden := filepath.Join("testdata", "status.golden")
	if *update {
		require.NoError(t, os.WriteFile(golden, b.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run go test -run TestStatusGolden -update to create it")
	require.Equal(t, string(want), b.String())
}

// Intents awaiting approval wait for a person: the verdict stays healthy, but the line
// no longer says that nothing needs attention, which read wrong to that person.
func TestStatusLineNamesIntentsAwaitingApproval(t *testing.T) {
	t.Parallel()
	rep := ops.Report{
		Now:     time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC),
		Verdict: ops.VerdictHealthy,
		Connectors: []ops.ConnectorStatus{
			{Connector: "payment", Counts: ops.Counts{Delivered: 4, AwaitingApproval: 2}, Verdict: ops.VerdictHealthy},
			{Connector: "webhook", Counts: ops.Counts{Delivered: 9, AwaitingApproval: 1}, Verdict: ops.VerdictHealthy},
		},
	}
	var b bytes.Buffer
	require.NoError(t, writeStatus(&b, rep, nil))
	first, _, _ := strings.Cut(b.String(), "\n")
	require.Equal(t, "healthy: 2 connector(s); 3 intent(s) await approval (outboxd list --status awaiting_approval)", first)

	rep.Connectors[0].Counts.AwaitingApproval, rep.Connectors[1].Counts.AwaitingApproval = 0, 0
	b.Reset()
	require.NoError(t, writeStatus(&b, rep, nil))
	first, _, _ = strings.Cut(b.String(), "\n")
	require.Equal(t, "healthy: 2 connector(s), nothing needs attention", first)
}

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook", "OUTBOX_WEBHOOK_GUARANTEE=enforced")
	d.seedEveryState(t)

	code, out, errOut := d.cli(t, "", "status")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(out, "\n")
	require.Equal(t, "rows stuck: webhook: rows stuck; 1 intent(s) await approval (outboxd list --status awaiting_approval)", lines[0])
	require.Regexp(t, `(?m)^CONNECTOR\s+GUARANTEE\s+PENDING\s+DELIVERING\s+DELIVERED\s+DEAD\s+CANCELED\s+AWAITING\s+HELD\s+OLDEST PENDING\s+STUCK\s+AMBIGUOUS\s+DEAD 1H\s+DEAD 24H\s+VERDICT$`, out)
	// webhook: 1 pending, 2 delivering, 1 delivered, 1 dead, 1 canceled, 1 awaiting, 1 held;
	// oldest pending 2h; 1 stuck; 1 ambiguous; the dead row went dead a minute ago.
	require.Regexp(t, `(?m)^webhook\s+enforced\s+1\s+2\s+1\s+1\s+1\s+1\s+1\s+2h0m\d+s\s+1\s+1\s+1\s+1\s+rows stuck$`, out)
	// slack has no configuration here: its guarantee is unknown. Its dead row is old.
	require.Regexp(t, `(?m)^slack\s+-\s+0\s+0\s+0\s+1\s+0\s+0\s+0\s+-\s+0\s+0\s+0\s+0\s+healthy$`, out)

	// --database-url wins over the variable.
	code, _, errOut = runCLI(t, []string{"OUTBOX_DATABASE_URL=postgres://nobody@127.0.0.1:1/none"},
		strings.NewReader(""), "status", "--database-url", d.dsn)
	require.Equal(t, exitOK, code, errOut)

	code, out, errOut = d.cli(t, "", "status", "--json")
	require.Equal(t, exitOK, code, errOut)
	var rep struct {
		Verdict    string `json:"verdict"`
		Connectors []struct {
			Connector string     `json:"connector"`
			Guarantee string     `json:"guarantee"`
			Counts    ops.Counts `json:"counts"`
			Stuck     int        `json:"stuck"`
			Verdict   string     `json:"verdict"`
		} `json:"connectors"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, ops.VerdictStuck, rep.Verdict)
	require.Len(t, rep.Connectors, 2)
	require.Equal(t, "slack", rep.Connectors[0].Connector)
	require.Empty(t, rep.Connectors[0].Guarantee)
	w := rep.Connectors[1]
	require.Equal(t, "webhook", w.Connector)
	require.Equal(t, "enforced", w.Guarantee)
	require.Equal(t, ops.Counts{Pending: 1, Delivering: 2, Delivered: 1, Dead: 1, Canceled: 1, AwaitingApproval: 1, Held: 1}, w.Counts)
	require.Equal(t, 1, w.Stuck)
}

func TestStatusConfigMissingShowsDash(t *testing.T) {
	t.Parallel()
	// A named instance without its URL: the configuration does not load, status still works.
	d := newOpsDB(t, "OUTBOX_CONNECTORS=webhook:crm")
	d.insert(t, fixture{Key: "a", Status: "delivered"})
	code, out, errOut := d.cli(t, "", "status")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^healthy: 1 connector\(s\), nothing needs attention$`, out)
	require.Regexp(t, `(?m)^webhook\s+-\s+0\s+0\s+1\s`, out)
}

func TestStatusEmpty(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	code, out, errOut := d.cli(t, "", "status")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "healthy: the outbox is empty\n", out)
}

// cancelOnWrite cancels a context once something is written: the watch loop then ends
// after its first screen.
type cancelOnWrite struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel()
	return w.buf.Write(p)
}

func TestStatusWatch(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "a", Status: "dead", UpdatedAgo: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &cancelOnWrite{cancel: cancel}
	var errb bytes.Buffer
	code := run(ctx, []string{"status", "--watch"}, d.environ, strings.NewReader(""), out, &errb)
	require.Equal(t, exitOK, code, errb.String())
	s := out.buf.String()
	require.True(t, strings.HasPrefix(s, clearScreen), "%q", s)
	require.Contains(t, s, "dead letters: webhook: dead letters\n")
	require.Contains(t, s, "Ctrl-C to stop")

	code, _, _ = d.cli(t, "", "status", "--watch", "--json")
	require.Equal(t, exitUsage, code)
}

// Every time the operator commands print is in UTC and says so ("...Z"). The watch
// footer printed the report's time in the zone the database driver gave it (the
// process's local zone) without naming the zone: "at 12:00:00" beside a table whose
// times are UTC.
func TestStatusWatchFooterTimeIsUTC(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &cancelOnWrite{cancel: cancel}
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	err := watchStatus(ctx, out, func(context.Context) (ops.Report, error) {
		return ops.Report{Now: now, Verdict: ops.VerdictHealthy}, nil
	}, nil)
	require.NoError(t, err)
	require.Contains(t, out.buf.String(), " at 10:00:00Z; Ctrl-C to stop")
}

// A database that accepts connections and never answers (a hung server, a stalled
// network path) fails an operator command after opsConnectTimeout: pgx has no connect
// timeout of its own, and the command hung until interrupted.
func TestOpsCommandGivesUpOnADatabaseThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	dsn := "postgres://app:hunter2@" + pgtest.UnansweringAddr(t) + "/app"
	for _, command := range []string{"status", "migrate"} {
		t.Run(command, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 3*opsConnectTimeout) // a bound for the test only
			defer cancel()
			var out, errb bytes.Buffer
			code := run(ctx, []string{command}, []string{"OUTBOX_DATABASE_URL=" + dsn}, strings.NewReader(""), &out, &errb)
			require.Equal(t, exitFailure, code, errb.String())
			require.NoError(t, ctx.Err(), "the command ended by itself")
			require.Contains(t, errb.String(), "timeout")
			require.NotContains(t, errb.String(), "hunter2")
		})
	}
}

// A read that fails (the database restarting or failing over, a connection reset) ended
// the watch with exit 1, leaving the operator without the view they were watching it
// with at the moment they most need it. The screen says the read failed, and the watch
// goes on reading.
func TestStatusWatchGoesOnAfterAFailedRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &cancelOnWrite{cancel: cancel}
	err := watchStatus(ctx, out, func(context.Context) (ops.Report, error) {
		return ops.Report{}, errors.New("read status: FATAL: terminating connection due to administrator command")
	}, nil)
	require.NoError(t, err)
	s := out.buf.String()
	require.True(t, strings.HasPrefix(s, clearScreen), "%q", s)
	require.Contains(t, s, "could not read the status: read status: FATAL: terminating connection due to administrator command\n")
	require.Contains(t, s, "Ctrl-C to stop")
}

// watchWriter is status --watch's terminal in TestStatusWatchGivesUpOnAReadWithoutAnswer:
// after the first screen it makes the watch's connection a black hole, and it ends the
// watch once a screen after the failed read shows the status again.
type watchWriter struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	screens  int
	failed   bool
	onFirst  func()
	cancel   context.CancelFunc
	finished bool
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.screens++
	switch {
	case w.screens == 1:
		w.onFirst()
	case bytes.Contains(p, []byte("could not read the status")):
		w.failed = true
	case w.failed:
		w.finished = true
		w.cancel()
	}
	return w.buf.Write(p)
}

// A watch whose connection the network dropped without a word (a failover that moved
// the database's address, a NAT gateway that forgot the connection) waited for the
// answer to its read until TCP keepalive gave up, most of an hour, its screen frozen on
// the last status. A read that gets no answer within the connect timeout now fails, the
// screen says so, and the next read, on a new connection, shows the status again.
func TestStatusWatchGivesUpOnAReadWithoutAnswer(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "a", Status: "dead", UpdatedAgo: time.Minute})
	path := pgtest.NewPath(t, d.pool)
	path.Watch("FILTER (WHERE status = 'pending')") // statusSQL
	u, err := url.Parse(d.dsn)
	require.NoError(t, err)
	u.Host = path.Addr()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &watchWriter{onFirst: path.BlackHole, cancel: cancel}
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"status", "--watch"}, []string{"OUTBOX_DATABASE_URL=" + u.String(), "USER=alice"},
			strings.NewReader(""), out, &errb)
	}()
	select {
	case code := <-done:
		require.Equal(t, exitOK, code, errb.String())
	// A bound for the test only, far past what the fix takes: the refresh's 2 s, the
	// read's 10 s, and up to pgx's 15 s to close the black-holed connection as the
	// command ends, with room for a loaded machine. Without the fix the read waits for
	// TCP keepalive, most of an hour.
	case <-time.After(9 * opsConnectTimeout):
		cancel()
		<-done
		t.Fatal("the watch still waited for the answer to its read")
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	require.True(t, out.finished, out.buf.String())
	require.Contains(t, out.buf.String(), "could not read the status: the database did not answer within 10s")
}

// The connectors with rows waiting for a relay that no running relay has get a line of
// their own: status said only "backlog growing", once a due row had waited a minute,
// and "nothing needs attention" of rows due later, while they waited for a relay that
// was not there.
func TestStatusNamesConnectorsNoRunningRelayHas(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	rep := ops.Report{
		Now:     time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC),
		Verdict: ops.VerdictHealthy,
		Connectors: []ops.ConnectorStatus{
			{Connector: "email", Counts: ops.Counts{Pending: 2}, Verdict: ops.VerdictHealthy, RelayRunning: &no},
			{Connector: "slack", Counts: ops.Counts{Delivered: 3}, Verdict: ops.VerdictHealthy, RelayRunning: &no},
			{Connector: "webhook", Counts: ops.Counts{Pending: 5}, Verdict: ops.VerdictHealthy, RelayRunning: &yes},
		},
	}
	var b bytes.Buffer
	require.NoError(t, writeStatus(&b, rep, nil))
	lines := strings.Split(b.String(), "\n")
	require.Equal(t, "healthy: 3 connector(s)", lines[0]) // not "nothing needs attention"
	require.Equal(t, "no running relay has email (2 pending): their rows wait until a relay with them runs", lines[1])

	rep.Verdict = ops.VerdictStuck
	rep.Connectors = append(rep.Connectors, ops.ConnectorStatus{Connector: "webhook:old",
		Counts: ops.Counts{Pending: 1, Delivering: 4}, Stuck: 4, Verdict: ops.VerdictStuck, RelayRunning: &no})
	b.Reset()
	require.NoError(t, writeStatus(&b, rep, nil))
	lines = strings.Split(b.String(), "\n")
	require.Equal(t, "rows stuck: webhook:old: rows stuck", lines[0])
	require.Equal(t, "no running relay has email (2 pending); webhook:old (1 pending, 4 stuck): "+
		"their rows wait until a relay with them runs", lines[1])

	var j bytes.Buffer
	require.NoError(t, writeJSON(&j, statusJSON(rep, nil)))
	require.Contains(t, j.String(), `"relay_running": false`)
	require.Contains(t, j.String(), `"relay_running": true`)

	// Unknown (nil), as before: nothing said.
	rep.Connectors = rep.Connectors[:1]
	rep.Connectors[0].RelayRunning = nil
	rep.Verdict = ops.VerdictHealthy
	b.Reset()
	require.NoError(t, writeStatus(&b, rep, nil))
	require.True(t, strings.HasPrefix(b.String(), "healthy: 1 connector(s), nothing needs attention\n\n"), b.String())

}
