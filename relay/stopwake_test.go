package relay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A relay that stops hands back the rows it claimed ahead and never started, for the
// relays still running with the same instances. Nothing told them: an idle one (it
// polls hourly here) found those rows only at its next poll interval, and a busy one,
// whose claims start near its newest rows, only at its next claim from the head of the
// index, though they were due all along.
func TestRowsHandedBackAtStopWakeOtherRelays(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	cfg := separateMetrics(b.fastConfig())
	cfg.Concurrency = 1 // one worker: the second row is claimed ahead and waits for it
	conn := newGatedConnector()
	stopping, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- stopping.Run(ctx) }()
	first, second := deliverOneOfTwo(t, b.pool, stopping, conn)

	b.startNotifyOnly(t) // the relay left running, idle
	cancel()             // SIGTERM: the row claimed ahead is handed back at once
	waitStatus(t, b.pool, second, outbox.StatusDelivered)

	close(conn.gate)
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("relay did not stop")
	}
	waitStatus(t, b.pool, first, outbox.StatusDelivered)
}

// Both hand-backs of a relay asked to stop wake the relays still running: of rows
// claimed and not started, and of the rows of a round whose reply was lost (found by
// its lease). Each NOTIFYs only when it handed back a row, and says how many it did.
func TestHandBacksOfAStoppingRelayNotify(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	stopped := make(chan struct{})
	close(stopped)
	runDone := (<-chan struct{})(stopped)
	r.runDone.Store(&runDone) // Run was asked to stop
	listener, err := b.pool.Acquire(t.Context())
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(t.Context(), "LISTEN "+notifyChannel)
	require.NoError(t, err)
	notified := func() bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		_, err := listener.Conn().WaitForNotification(ctx)
		return err == nil
	}

	enqueue(t, b.pool, "a", "webhook", []int{1})
	enqueue(t, b.pool, "b", "webhook", []int{2})
	for notified() { // the inserts' own
	}
	rows := claimRows(t, r, "webhook")
	require.Len(t, rows, 2)

	require.True(t, r.releaseRows(t.Context(), rows[:1]))
	require.True(t, notified(), "handing back a row not started wakes the other relays")
	require.NoError(t, r.releaseLost(t.Context(), []time.Time{rows[1].lease}, waitTimeout))
	require.True(t, notified(), "handing back the rows of a lost round wakes the other relays")
	require.Equal(t, 2, countStatus(t, b.pool)[outbox.StatusPending])

	require.NoError(t, r.releaseLost(t.Context(), []time.Time{rows[1].lease}, waitTimeout))
	require.False(t, notified(), "nothing handed back, nothing to wake for")
}

// A relay that stops writes the outcomes of its deliveries in flight once they end, and
// one that ends a row of an ordering key lets the key's next row go. It no longer claims
// that row itself, and nothing told the relays still running: an idle one (it polls
// hourly here) found it only at its next poll interval, though it was due at once.
func TestOrderedOutcomeOfAStoppingRelayWakesOtherRelays(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	conn := newGatedConnector()
	stopping, err := New(b.pool, separateMetrics(b.fastConfig()), map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- stopping.Run(ctx) }()
	_, err = outbox.EnqueueBatch(t.Context(), b.pool, []outbox.Message{
		{Key: "head", Connector: "webhook", OrderingKey: "k", Payload: []int{1}},
		{Key: "next", Connector: "webhook", OrderingKey: "k", Payload: []int{2}},
	})
	require.NoError(t, err)
	require.Equal(t, "head", conn.waitFirst(t)) // in flight; next waits for it

	b.startNotifyOnly(t) // the relay left running, idle
	cancel()             // SIGTERM
	require.Eventually(t, func() bool { return len(wakeRows(t, b, stopping.ID())) == 0 }, waitTimeout, 10*time.Millisecond,
		"the stopping relay's claim loop has ended")
	close(conn.gate) // the attempt in flight ends; its outcome is written after the stop
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("relay did not stop")
	}
	waitStatus(t, b.pool, "head", outbox.StatusDelivered)
	waitStatus(t, b.pool, "next", outbox.StatusDelivered)
}

// A busy relay's fast-polling mark keeps the inserts of its instances from sending
// NOTIFY, and it may have no room to claim the rows inserted meanwhile. When it stops,
// they are still pending, and the relays still running with those instances heard
// nothing of them: its withdrawal only let later inserts NOTIFY again, and an idle relay
// (it polls hourly here) found the rows already there only at its next poll interval.
func TestStoppingRelayWakesOtherRelaysForRowsItsMarkSilenced(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	cfg := separateMetrics(b.fastConfig())
	cfg.Concurrency = 1
	conn := newGatedConnector()
	conn.timeout = 0 // no rows claimed ahead: the one in flight leaves no room
	stopping, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- stopping.Run(ctx) }()
	enqueue(t, b.pool, "first", "webhook", []int{1})
	require.Equal(t, "first", conn.waitFirst(t))

	b.startNotifyOnly(t) // the relay left running, idle
	// The stopping relay's mark, written for an hour in the insert's own transaction:
	// the insert sends no NOTIFY, however long this test took to get here.
	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = tx.Exec(t.Context(), pollFastSQL, stopping.ID(), []string{"webhook"}, time.Hour)
	require.NoError(t, err)
	enqueue(t, tx, "second", "webhook", []int{2})
	require.NoError(t, tx.Commit(t.Context()))

	cancel() // SIGTERM, with "first" still in flight and "second" pending
	waitStatus(t, b.pool, "second", outbox.StatusDelivered)

	close(conn.gate)
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("relay did not stop")
	}
	waitStatus(t, b.pool, "first", outbox.StatusDelivered)
}
