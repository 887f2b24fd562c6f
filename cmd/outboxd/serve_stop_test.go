package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// While a stopping relay finishes its deliveries in flight (up to
// OUTBOX_SHUTDOWN_TIMEOUT, and then records their outcomes), serve's HTTP server goes on
// answering: /healthz that the process lives, /readyz that it is stopping (503), and
// /metrics. It shut down at the same moment as the relay, so for the whole stop every
// probe and scrape was refused: a liveness probe could take the draining process for a
// dead one, and /readyz never said "stopping", as the README says it does.
func TestServeAnswersWhileTheRelayStops(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}), make(chan struct{})
	var arrivedOnce, releaseOnce sync.Once
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(receiver.Effect) {
		arrivedOnce.Do(func() { close(arrived) })
		<-release // held until the test has looked at the HTTP server while stopping
	}})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	releaseHeld := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseHeld) // before rcv.Close: no handler stays blocked

	dsn := pgtest.URL(t)
	environ := []string{
		"OUTBOX_DATABASE_URL=" + dsn,
		"OUTBOX_WEBHOOK_URL=" + rcv.URL(),
		"OUTBOX_HTTP_ADDR=127.0.0.1:0", // it logs the port it got
		"OUTBOX_LOG_FORMAT=json",
		"OUTBOX_POLL_INTERVAL=50ms",
		// The held request stays open across every step below: neither its time limit
		// nor the shutdown timeout may end it on a busy machine.
		"OUTBOX_WEBHOOK_TIMEOUT=1h",
		"OUTBOX_LEASE=1h20s",
		"OUTBOX_SHUTDOWN_TIMEOUT=1h",
	}
	srv := startServe(t, environ)
	addr, stderr, stopServe := srv.addr, srv.stderr, srv.stop
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	get := func(path string) (int, string) {
		res, err := client.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, processWait, 10*time.Millisecond, "%s", stderr)

	direct, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	_, err = outbox.Enqueue(t.Context(), direct, outbox.Message{Key: "in-flight", Connector: "webhook", Payload: map[string]int{"n": 1}})
	require.NoError(t, err)
	select {
	case <-arrived:
	case <-time.After(processWait):
		t.Fatalf("the row never reached the receiver\n%s", stderr)
	}

	stopServe() // SIGTERM
	require.Eventually(t, func() bool {
		_, ok := findLog(stderr.String(), "stopping")
		return ok
	}, processWait, 10*time.Millisecond, "%s", stderr)
	// The delivery is still held: the relay is stopping.
	status, body := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, status, "/readyz while the relay stops: %s", body)
	require.Contains(t, body, "stopping")
	status, body = get("/healthz")
	require.Equal(t, http.StatusOK, status, "/healthz while the relay stops: %s", body)
	status, body = get("/metrics")
	require.Equal(t, http.StatusOK, status, "/metrics while the relay stops: %s", body)
	require.Contains(t, body, "outboxd_deliveries_in_flight 1")

	releaseHeld()
	require.Equal(t, exitOK, srv.exitCode(t), "%s", stderr)
	in, err := outbox.Get(t.Context(), direct, "in-flight")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status, "the delivery in flight finished during the stop")
	// Stopped with the relay, the HTTP server answers no more.
	status, _ = get("/healthz")
	require.Zero(t, status, "the HTTP server is closed once serve has returned")
}

// A stop that comes before serve listens (SIGTERM right after the start, or while the
// name in OUTBOX_HTTP_ADDR is looked up) is a stop like any other: exit 0, as when it
// comes while the relay waits for the database at start. The listen, which takes the
// stopped context, failed with "lookup localhost: operation was canceled" and exit 1.
func TestServeStoppedBeforeItListensExitsZero(t *testing.T) {
	t.Parallel()
	environ := []string{
		"OUTBOX_DATABASE_URL=postgres://outboxd@" + pgtest.UnreachableAddr(t) + "/outboxd",
		"OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook",
		"OUTBOX_HTTP_ADDR=localhost:0", // a name: its lookup takes the context
	}
	ctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	stop() // the signal came first
	var stderr lockedBuffer
	require.Equal(t, exitOK, run(ctx, []string{"serve"}, environ, strings.NewReader(""), io.Discard, &stderr), "%s", &stderr)
	require.NotContains(t, stderr.String(), "listen on OUTBOX_HTTP_ADDR")
}
