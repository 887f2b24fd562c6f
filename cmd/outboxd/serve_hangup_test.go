package main

import (
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// TestServeStopsGracefullyOnSIGHUP sends `outboxd serve` SIGHUP, as a terminal or an SSH
// session that goes away does, while a delivery is in flight. Its default ended the
// process at once: the delivery's outcome was never recorded, and the row stayed
// delivering until its lease ran out, to be retried as an ambiguous attempt (a second
// effect at a receiver that does not enforce the key). serve now stops as on SIGTERM:
// the delivery finishes, its outcome is recorded, and the process exits 0.
func TestServeStopsGracefullyOnSIGHUP(t *testing.T) {
	t.Parallel()
	const key = "hangup"

	arrived, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseHeld := func() { releaseOnce.Do(func() { close(release) }) }
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(e receiver.Effect) {
		if e.Key == key {
			close(arrived) // the receiver enforces keys: one effect a key
			<-release
		}
	}})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	t.Cleanup(releaseHeld) // before rcv.Close: no handler stays blocked

	dsn := pgtest.URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	c := startChild(t, "serve",
		"OUTBOX_DATABASE_URL="+dsn,
		"OUTBOX_WEBHOOK_URL="+rcv.URL(),
		"OUTBOX_HTTP_ADDR=127.0.0.1:0",
		"OUTBOX_POLL_INTERVAL=50ms",
		"OUTBOX_WEBHOOK_TIMEOUT=1h", // the held request outlasts no time limit on a busy machine
		"OUTBOX_LEASE=1h20s",
	)
	_, err = outbox.Enqueue(t.Context(), pool, outbox.Message{Key: key, Connector: "webhook", Payload: map[string]int{"n": 1}})
	require.NoError(t, err)
	select {
	case <-arrived:
	case <-c.exited:
		t.Fatalf("serve exited (%v) before delivering %q", c.waitErr, key)
	case <-time.After(processWait):
		t.Fatalf("serve never delivered %q", key)
	}

	require.NoError(t, syscall.Kill(-c.cmd.Process.Pid, syscall.SIGHUP))
	c.waitOutput(t, "stopping: finishing deliveries in flight")
	releaseHeld()
	select {
	case <-c.exited:
	case <-time.After(processWait):
		t.Fatalf("serve did not exit within %s of SIGHUP", processWait)
	}
	require.Equal(t, exitOK, c.cmd.ProcessState.ExitCode(), "serve stops on SIGHUP as on SIGTERM")
	in, err := outbox.Get(t.Context(), pool, key)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status, "the delivery in flight at SIGHUP is recorded")
	require.Equal(t, 1, rcv.Effects(key), "one effect")
}
