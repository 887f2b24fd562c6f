package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
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
	cancel, stopped := runSignalled(t, stopping)
	first, second := deliverOneOfTwo(t, b.pool, stopping, conn)

	b.startNotifyOnly(t) // the relay left running, idle
	cancel()             // SIGTERM: the row claimed ahead is handed back at once
	waitStatus(t, b.pool, second, outbox.StatusDelivered)

	close(conn.gate)
	stopped()
	waitStatus(t, b.pool, first, outbox.StatusDelivered)
}

// Both hand-backs of a relay asked to stop wake the relays still running: of rows
// claimed and not started, and of the rows of a round whose reply was lost (found by
// its lease). Each NOTIFYs only when it handed back a row, and says how many it did; in
// every query exec mode (behind a transaction pooler, the simple protocol).
func TestHandBacksOfAStoppingRelayNotify(t *testing.T) {
	t.Parallel()
	for _, mode := range append([]pgx.QueryExecMode{pgx.QueryExecModeCacheStatement}, pgtest.ExecModes...) {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			_, cfg := b.clockedConfig(t)
			r, err := New(pgtest.InMode(t, b.pool, mode), cfg, map[string]Instance{"webhook": {Connector: b.hook}})
			require.NoError(t, err)
			stopped := make(chan struct{})
			close(stopped)
			runDone := (<-chan struct{})(stopped)
			r.runDone.Store(&runDone) // Run was asked to stop
			notified := listenFor(t, b)

			enqueue(t, b.pool, "a", "webhook", []int{1})
			enqueue(t, b.pool, "b", "webhook", []int{2})
			for notified() { // the inserts' own
			}
			rows := claimRows(t, r, "webhook")
			require.Len(t, rows, 2)

			n, ok := r.releaseRows(t.Context(), rows[:1])
			require.True(t, ok)
			require.Equal(t, int64(1), n)
			require.True(t, notified(), "handing back a row not started wakes the other relays")
			require.NoError(t, r.releaseLost(t.Context(), []time.Time{rows[1].lease}, waitTimeout))
			require.True(t, notified(), "handing back the rows of a lost round wakes the other relays")
			require.Equal(t, 2, countStatus(t, b.pool)[outbox.StatusPending])

			require.NoError(t, r.releaseLost(t.Context(), []time.Time{rows[1].lease}, waitTimeout))
			require.False(t, notified(), "nothing handed back, nothing to wake for")
		})
	}
}

// listenFor LISTENs on a connection of b's pool held until the test ends, and returns a
// function that reports whether a notification arrives within a moment.
func listenFor(t *testing.T, b *testBundle) (notified func() bool) {
	t.Helper()
	listener, err := b.pool.Acquire(t.Context())
	require.NoError(t, err)
	t.Cleanup(listener.Release)
	_, err = listener.Exec(t.Context(), "LISTEN "+notifyChannel)
	require.NoError(t, err)
	return func() bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		_, err := listener.Conn().WaitForNotification(ctx)
		return err == nil
	}
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
	cancel, stopped := runSignalled(t, stopping)
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
	stopped()
	waitStatus(t, b.pool, "first", outbox.StatusDelivered)
}
