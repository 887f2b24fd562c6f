package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// serveChildEnv makes the test binary run `outboxd serve` (see TestMain) instead of the
// tests, so a test can stop a real process with a real signal.
const serveChildEnv = "OUTBOXD_TEST_SERVE_CHILD" // not OUTBOX_: serve would warn about it

// processWait bounds every wait on the child process. Reaching it means something is
// stuck, not slow.
const processWait = 60 * time.Second

func TestMain(m *testing.M) {
	if os.Getenv(serveChildEnv) == "1" {
		os.Exit(runProcess([]string{"serve"}))
	}
	if args := os.Getenv(childArgsEnv); args != "" {
		os.Exit(runChild(strings.Fields(args)))
	}
	pgtest.Main(m)
}

// TestServeStopsGracefullyOnSIGTERM runs `outboxd serve` as a process with two workers,
// stops it with SIGTERM while both deliveries are in flight and rows claimed behind them
// wait for a worker, and checks that the deliveries finish and are recorded, that the
// waiting rows are handed back unattempted, that no row is left leased, and that the
// process exits 0.
func TestServeStopsGracefullyOnSIGTERM(t *testing.T) {
	t.Parallel()
	const inFlightKey, secondKey = "in-flight", "in-flight-2"
	others := []string{"other-1", "other-2", "other-3"}
	keys := append([]string{inFlightKey}, others...)
	waiting := []string{"waiting-1", "waiting-2", "waiting-3"}

	var (
		releaseOnce sync.Once
		arrived     = map[string]chan struct{}{inFlightKey: make(chan struct{}), secondKey: make(chan struct{})}
		release     = make(chan struct{})
	)
	releaseHeld := func() { releaseOnce.Do(func() { close(release) }) }
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(e receiver.Effect) {
		if ch, ok := arrived[e.Key]; ok {
			// Each key has one effect (the receiver enforces keys), so this runs once
			// a key.
			close(ch)
			<-release // hold the request open until the test lets it go
		}
	}})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	t.Cleanup(releaseHeld) // runs before rcv.Close: no handler stays blocked

	dsn := pgtest.URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	// The child inherits the environment but none of the caller's OUTBOX_ variables,
	// which would change its configuration, nor GOGC or GOMEMLIMIT, so that it sets the
	// garbage collector itself.
	environ := make([]string, 0, len(os.Environ())+8)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") && !strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			environ = append(environ, kv)
		}
	}
	secret, hash, err := intent.NewToken()
	require.NoError(t, err)
	environ = append(environ,
		`OUTBOX_API_TOKENS=[{"name":"agent","sha256":"`+hash+`","connectors":["webhook"]}]`,
		serveChildEnv+"=1",
		"OUTBOX_DATABASE_URL="+dsn,
		"OUTBOX_WEBHOOK_URL="+rcv.URL(),
		"OUTBOX_WEBHOOK_GUARANTEE=enforced",
		// The held request stays open from its arrival until after SIGTERM, across
		// every step below: the default 10s time limit could end it on a busy machine
		// (a second attempt, not the one delivery this test checks). An hour, with the
		// lease the default 20s longer, gives rows as long to start as the defaults do.
		"OUTBOX_WEBHOOK_TIMEOUT=1h",
		"OUTBOX_LEASE=1h20s",
		"OUTBOX_HTTP_ADDR=127.0.0.1:0", // the child logs the port it got
		"OUTBOX_POLL_INTERVAL=50ms",
		"OUTBOX_CONCURRENCY=2", // in-flight and then in-flight-2 hold both workers
		"OUTBOX_SHUTDOWN_TIMEOUT=30s",
		"OUTBOX_LOG_FORMAT=json",
	)
	var stdout, stderr lockedBuffer
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = environ
	child.Stdout = &stdout
	child.Stderr = &stderr
	require.NoError(t, child.Start())
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = child.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = child.Process.Kill()
			<-exited
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("child stdout:\n%s\nchild stderr:\n%s", stdout.String(), stderr.String())
		}
	})

	// waitFor polls cond until it holds, failing if the child exits first or the wait
	// runs out.
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(processWait)
		for !cond() {
			select {
			case <-exited:
				t.Fatalf("the child exited (%v) while waiting for %s", waitErr, what)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("gave up after %s waiting for %s", processWait, what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	var base string
	waitFor("the child's HTTP server to listen", func() bool {
		rec, ok := findLog(stderr.String(), "http server listening")
		if !ok {
			return false
		}
		addr, _ := rec["addr"].(string)
		base = "http://" + addr
		return addr != ""
	})
	// A relay process sets the collector as planGC says (the default bound on claimed
	// payloads: 128 MiB).
	started, ok := findLog(stderr.String(), "outboxd starting")
	require.True(t, ok, "the child logs its start")
	p := planGC(func(string) string { return "" }, 128<<20, memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem))
	require.Equal(t, formatGC(uint64(p.percent), uint64(p.limit)), started["gc"])
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	get := func(path string) (int, string) {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	for i, key := range keys {
		_, err := outbox.Enqueue(t.Context(), pool, outbox.Message{Key: key, Connector: "webhook", Payload: map[string]int{"n": i}})
		require.NoError(t, err)
	}
	select {
	case <-arrived[inFlightKey]:
	case <-exited:
		t.Fatalf("the child exited (%v) before delivering %q", waitErr, inFlightKey)
	case <-time.After(processWait):
		t.Fatalf("the child never delivered %q", inFlightKey)
	}
	// The other rows are not held: they are delivered before the stop, so the stop has
	// exactly one delivery in flight.
	for _, key := range others {
		waitFor(key+" to be delivered", func() bool {
			in, err := outbox.Get(t.Context(), pool, key)
			return err == nil && in.Status == outbox.StatusDelivered
		})
	}
	in, err := outbox.Get(t.Context(), pool, inFlightKey)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "the held row is in flight")

	var lastReady string
	waitFor("/readyz to answer 200", func() bool {
		code, body := get("/readyz")
		lastReady = fmt.Sprintf("%d %s", code, body)
		return code == http.StatusOK
	})
	require.Contains(t, lastReady, "ready")
	waitFor("/metrics to show outboxd_deliveries_total", func() bool {
		code, body := get("/metrics")
		return code == http.StatusOK && strings.Contains(body, "outboxd_deliveries_total")
	})

	// The intent API and MCP are served beside the relay.
	req, err := http.NewRequest(http.MethodPost, base+"/v1/intents", strings.NewReader(`{"connector":"webhook","payload":{"via":"api"}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Idempotency-Key", "via-api")
	resp, err := client.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	waitFor("the API's intent to be delivered", func() bool {
		in, err := outbox.Get(t.Context(), pool, "via-api")
		return err == nil && in.Status == outbox.StatusDelivered && in.CreatedBy == "agent"
	})
	code, _ := get("/mcp")
	require.Equal(t, http.StatusUnauthorized, code, "/mcp wants a bearer token")
	require.NotContains(t, stderr.String(), secret, "the token never reaches the logs")

	// The second worker takes a held row too, and the rows enqueued after it are
	// claimed behind the two, waiting for a worker.
	_, err = outbox.Enqueue(t.Context(), pool, outbox.Message{Key: secondKey, Connector: "webhook", Payload: map[string]int{"n": len(keys)}})
	require.NoError(t, err)
	select {
	case <-arrived[secondKey]:
	case <-exited:
		t.Fatalf("the child exited (%v) before delivering %q", waitErr, secondKey)
	case <-time.After(processWait):
		t.Fatalf("the child never delivered %q", secondKey)
	}
	for i, key := range waiting {
		_, err := outbox.Enqueue(t.Context(), pool, outbox.Message{Key: key, Connector: "webhook", Payload: map[string]int{"w": i}})
		require.NoError(t, err)
	}
	waitFor("the waiting rows to be claimed", func() bool {
		var n int
		return pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE idempotency_key = ANY($1) AND status = 'delivering'`, waiting).
			Scan(&n) == nil && n == len(waiting)
	})

	require.NoError(t, child.Process.Signal(syscall.SIGTERM))
	// The rows no worker started are handed back while the two deliveries are still
	// held. Let those go only then, so they finish during the graceful shutdown rather
	// than before it.
	waitFor(`the "stopping" log line`, func() bool {
		_, ok := findLog(stderr.String(), "stopping")
		return ok
	})
	waitFor("the waiting rows to be handed back", func() bool {
		var n int
		return pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE idempotency_key = ANY($1) AND status = 'pending'`, waiting).
			Scan(&n) == nil && n == len(waiting)
	})
	releaseHeld()
	select {
	case <-exited:
	case <-time.After(processWait):
		t.Fatalf("the child did not exit within %s of SIGTERM", processWait)
	}
	require.NoError(t, waitErr)
	require.Equal(t, exitOK, child.ProcessState.ExitCode())

	// The in-flight deliveries finished and were recorded, in one attempt each.
	for _, key := range []string{inFlightKey, secondKey} {
		in, err = outbox.Get(t.Context(), pool, key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, in.Status, "%s: the in-flight row finished during the shutdown", key)
		require.Equal(t, 1, in.Attempts, key)
		var outcome string
		var ambiguous bool
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT a.outcome, a.ambiguous
			FROM outbox_attempts a JOIN outbox o ON o.id = a.outbox_id WHERE o.idempotency_key = $1`, key).
			Scan(&outcome, &ambiguous))
		require.Equal(t, "delivered", outcome, key)
		require.False(t, ambiguous, "%s: the delivery was not cut short", key)
	}
	// The rows no worker started are pending again, their claim not counted as an
	// attempt, and never sent.
	for _, key := range waiting {
		in, err := outbox.Get(t.Context(), pool, key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, in.Status, key)
		require.Zero(t, in.Attempts, key)
		require.Zero(t, rcv.Requests(key), key)
	}

	// Nothing is left leased, and every other row is delivered.
	var leased, undelivered int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT
		count(*) FILTER (WHERE status = 'delivering' OR lease_owner IS NOT NULL),
		count(*) FILTER (WHERE status <> 'delivered' AND NOT idempotency_key = ANY($1))
		FROM outbox`, waiting).Scan(&leased, &undelivered))
	require.Zero(t, leased, "rows left delivering or leased")
	require.Zero(t, undelivered, "rows not delivered")

	// Each key's effect happened exactly once. The receiver enforces keys, so its
	// effect counts cannot show a row sent twice; its request counts can.
	for _, key := range append(keys, secondKey, "via-api") {
		require.Equal(t, 1, rcv.Effects(key), "effects for %q", key)
		require.Equal(t, 1, rcv.Requests(key), "requests for %q: sent once", key)
	}
	require.Equal(t, len(keys)+2, rcv.TotalEffects(), "the rows enqueued here and the one from the API")
	require.Empty(t, rcv.DuplicateKeys())

	logs := stderr.String()
	rec, ok := findLog(logs, "stopping")
	require.True(t, ok, "no stopping line in:\n%s", logs)
	require.Equal(t, "30s", rec["shutdown_timeout"])
	_, ok = findLog(logs, "outboxd stopped")
	require.True(t, ok, "no outboxd stopped line in:\n%s", logs)
	_, ok = findLog(logs, "shutdown timeout reached")
	require.False(t, ok, "the shutdown timeout was reached:\n%s", logs)
}

// findLog returns the first complete JSON log record in logs whose msg starts with
// prefix.
func findLog(logs, prefix string) (map[string]any, bool) {
	lines := strings.Split(logs, "\n")
	// The last element is empty or a line still being written.
	for _, line := range lines[:len(lines)-1] {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, prefix) {
			return rec, true
		}
	}
	return nil, false
}

// lockedBuffer is a bytes.Buffer that a child process writes to while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
