package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// A receiver down for a while kills the head of an ordering key, then the next row (a
// dead row no longer holds its key back), and the operator replays the dead rows once it
// is back, paced (--rate, the README's example) or in several batches. A filter selects
// rows newest first, and each batch commits on its own: the later row was put back first
// and a relay sent it while the earlier one was still dead, so the key's rows went out
// in reverse order. Rows put back are taken oldest first, so a row is never put back
// before an earlier row of its key that the replay also selects.
func TestPacedReplayKeepsTheOrderOfAnOrderingKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	for _, k := range []string{"step-1", "step-2"} {
		_, err := outbox.Enqueue(t.Context(), pool, outbox.Message{Key: k, Connector: "webhook",
			Payload: map[string]string{"step": k}, OrderingKey: "cust-1"})
		require.NoError(t, err)
	}
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead', attempts = 1, last_error = 'attempt 1: 503'`)
	require.NoError(t, err)

	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced, Timeout: 5 * time.Second})
	require.NoError(t, err)
	r, err := relay.New(pool, &relay.Config{PollInterval: 20 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		map[string]relay.Instance{"webhook": {Connector: hook}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	// Between batches (a paced replay waits a second or more), the relay delivers what
	// the batch put back.
	settled := func(int, int) {
		require.Eventually(t, func() bool {
			return count(t, pool, `SELECT count(*) FROM outbox WHERE status IN ('pending', 'delivering')`) == 0
		}, time.Minute, 10*time.Millisecond)
	}
	res, err := ops.Replay(t.Context(), pool,
		ops.Selection{Filter: &ops.Filter{Status: []string{outbox.StatusDead}, OrderingKey: "cust-1"}},
		ops.ReplayOptions{Actor: "op", Reason: "receiver is back", BatchSize: 1, ProgressFunc: settled})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"step-1", "step-2"}, res.Replayed)

	var order []string
	for _, e := range rcv.EffectLog() {
		order = append(order, e.Key)
	}
	require.Equal(t, []string{"step-1", "step-2"}, order, "the rows of ordering key cust-1 went out of order")
}
