package relay

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
)

// A rate-limited instance's rows are claimed at its rate, and the rate held only while
// each went out at once. When other instances' slow attempts held every delivery slot, a
// row waited for one while the instance's tokens came back; once the slot came free, it
// went out, and the next claim, on the tokens that came meanwhile, sent another row with
// it: two requests at once to a receiver limited to one a second, which its own limit
// answers with 429.
func TestRateLimitHoldsWhenRowsWaitForASlot(t *testing.T) {
	t.Parallel()
	slowHook, slow, release := newSlowHook(t)
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Concurrency = 2
	// The slow instance's hour-long time limit fits in the lease: it claims ahead, so the
	// relay has room to claim for the paced instance while the slow attempts hold both
	// slots, and a paced row may wait up to 5s (on the relay's clock) for one.
	cfg.Lease = time.Hour + 25*time.Second
	c := &pacedConnector{clock: clock, started: make(chan struct{}), gate: make(chan struct{})}
	closeOnce(c.gate) // no request is held
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: c, Concurrency: 2, Rate: 1},
		"webhook:slow": {Connector: slowHook, Concurrency: 2},
	})
	require.NoError(t, err)
	runWorkers(t, r, release)
	paced := r.instances["webhook"]
	idle := func() {
		t.Helper()
		require.Eventually(t, func() bool { return paced.claimed.Load() == 0 }, waitTimeout, 10*time.Millisecond)
	}

	enqueue(t, b.pool, "slow-0", "webhook:slow", []int{0})
	enqueue(t, b.pool, "slow-1", "webhook:slow", []int{1})
	require.Equal(t, 2, claimOnce(t, r))
	require.Eventually(t, func() bool { return slow.TotalEffects() == 2 }, waitTimeout, 10*time.Millisecond,
		"the slow attempts hold both slots")

	for i := range 3 {
		enqueue(t, b.pool, fmt.Sprint("paced-", i), "webhook", []int{i})
	}
	require.Equal(t, 1, claimOnce(t, r), "a token's worth, whose worker waits for a slot")
	clock.Advance(time.Second) // a second's token comes while it waits
	release()
	require.Eventually(t, func() bool { return len(c.times()) == 1 }, waitTimeout, 10*time.Millisecond,
		"the row goes once the slots come free")
	idle()
	for i := 0; len(c.times()) < 3; i++ {
		require.Less(t, i, 50, "every row is delivered in the end")
		if claimOnce(t, r) == 0 {
			clock.Advance(time.Second)
		}
		idle()
	}

	at := c.times()
	for i := 1; i < len(at); i++ {
		require.GreaterOrEqual(t, at[i].Sub(at[i-1]), time.Second, "requests %d and %d at rate 1/s: %v", i-1, i, at)
	}
}

// runWorkers starts the workers of every instance of r, without its claim loop (the
// test claims with claimOnce); they stop at the test's end, after releases (of answers
// the test's receivers hold back) have run.
func runWorkers(t *testing.T, r *Relay, releases ...func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	var workers sync.WaitGroup
	for _, inst := range r.instances {
		for range inst.limit {
			workers.Go(func() { r.work(ctx, ctx, inst) })
		}
	}
	t.Cleanup(func() {
		for _, release := range releases {
			release()
		}
		cancel()
		for _, inst := range r.instances {
			close(inst.jobs)
		}
		workers.Wait()
	})
}
