package relay

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
)

// A rate-limited instance's workers read the clock and then take their tokens, and a
// worker can be preempted in between: another worker's later reading may then take its
// token first. The limiter took the earlier reading as the time of its last request, so
// the time between the two readings was counted as time gone by twice, and the next
// claim had tokens it should not have (here two requests more at once, at 40/s with a
// burst of 4).
func TestRateLimitHoldsWhenWorkersTakeTokensOutOfOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	type stall struct{ reached, release chan struct{} }
	var stalls atomic.Pointer[stall]
	cfg.NowFunc = func() time.Time {
		now := clock.Now()
		if s := stalls.Swap(nil); s != nil { // preempted just after reading the clock
			close(s.reached)
			<-s.release
		}
		return now
	}
	for i := range 10 {
		enqueue(t, b.pool, fmt.Sprint("paced-", i), "webhook", []int{i})
	}
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook, Rate: 40}})
	require.NoError(t, err)
	inst := r.instances["webhook"]
	ctx := t.Context()

	require.Equal(t, 4, claimOnce(t, r), "the burst")
	r.deliver(ctx, inst, <-inst.jobs)
	r.deliver(ctx, inst, <-inst.jobs)
	first, second := <-inst.jobs, <-inst.jobs
	s := &stall{reached: make(chan struct{}), release: make(chan struct{})}
	stalls.Store(s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.deliver(ctx, inst, first)
	}()
	waitFor(t, s.reached, "the first worker has read the clock")
	clock.Advance(50 * time.Millisecond) // two tokens' time
	r.deliver(ctx, inst, second)         // the second worker reads it later, and goes first
	close(s.release)
	waitFor(t, done, "the first worker's request goes")
	require.Equal(t, 4, b.receiver.TotalEffects())

	// Four requests within 50ms took the burst of 4 and the two tokens that came since:
	// two are left.
	require.Equal(t, 2, claimOnce(t, r), "tokens after four requests in 50ms at 40/s")
}
