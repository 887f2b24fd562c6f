package relay

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A relay stops while the outcome of one row waits for another session's lock (set
// aside by the claim loop), and a delivery is still in flight. The stopping relay's
// recorder wrote the set-aside outcome first, retrying it until the drain time ran out,
// and only then the outcomes of the deliveries that ended during the stop: by then it
// had no time left, and those were never written, though nothing held them up. Their
// rows stayed leased, to come back as ambiguous attempts. Now the locked outcome is set
// aside as the claim loop sets it aside: the others are written as they come, and it is
// written once the lock is let go.
func TestStoppingRelayWritesOtherOutcomesWhileOneWaitsForALock(t *testing.T) {
	t.Parallel()
	slowHook, slow, releaseSlow := newSlowHook(t)
	b := setup(t, receiver.Options{})
	logs := &logBuffer{}
	cfg := b.fastConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	gate := &afterEffectGate{Connector: b.hook, key: "locked", acted: make(chan struct{}), open: make(chan struct{})}
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: gate},
		"webhook:slow": {Connector: slowHook},
	})
	require.NoError(t, err)
	stop, stopped := runSignalled(t, r)

	locked := enqueue(t, b.pool, "locked", "webhook", []int{1})
	waitFor(t, gate.acted, "the row was never sent")
	locker := lockRow(t, b.pool, locked.ID)
	close(gate.open)
	waitForLockWait(t, b.pool, r, locker)
	enqueue(t, b.pool, "in-flight", "webhook:slow", []int{2})
	require.Eventually(t, func() bool { return slow.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond,
		"the slow attempt is in flight")

	stop()
	releaseSlow() // the attempt in flight ends while the relay stops
	waitStatus(t, b.pool, "in-flight", outbox.StatusDelivered)
	in, err := outbox.Get(t.Context(), b.pool, "locked")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "its outcome waits for the lock")

	require.NoError(t, locker.Rollback(t.Context()))
	stopped()
	for _, key := range []string{"locked", "in-flight"} {
		in, err := outbox.Get(t.Context(), b.pool, key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, in.Status, key)
		got := attemptsOf(t, b.pool, key)
		require.Len(t, got, 1, "%s: %+v", key, got)
		require.Equal(t, statusDelivered, got[0].Outcome, key)
	}
	require.NotContains(t, logs.String(), "could not record every outcome")
}
