package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A rate-limited instance sends no more than its rate within any one second, the second
// that starts with its burst included (at start, or after a quiet spell): the burst
// went at once and the tokens then came at the rate, so at 100/s the first second saw
// the burst of 10 and 99 more, 109 requests, which a receiver that counts its limit over
// a second answers with 429.
func TestRateLimitHoldsWithinEverySecond(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	c := &pacedConnector{clock: clock, started: make(chan struct{}), gate: make(chan struct{})}
	closeOnce(c.gate) // no request is held
	msgs := make([]outbox.Message, 300)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: fmt.Sprint("paced-", i), Connector: "webhook", Payload: []int{i}}
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: c, Concurrency: 10, Rate: 100}})
	require.NoError(t, err)
	inst := r.instances["webhook"]
	runWorkers(t, r)

	// Two seconds on the relay's clock, in steps of 10ms, each with a round of claims
	// whose rows are all sent before the clock moves on.
	for range 200 {
		claimOnce(t, r)
		require.Eventually(t, func() bool { return inst.claimed.Load() == 0 }, waitTimeout, time.Millisecond)
		clock.Advance(10 * time.Millisecond)
	}

	at := c.times()
	require.Greater(t, len(at), 150, "the rows go at the rate")
	for i := range at {
		n := 0
		for _, s := range at[i:] {
			if s.Sub(at[i]) < time.Second {
				n++
			}
		}
		require.LessOrEqual(t, n, 100, "requests within the second from %d (at %v), at 100/s", i, at[i].Sub(at[0]))
	}
}
