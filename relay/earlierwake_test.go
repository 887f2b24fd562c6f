package relay

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// An operator replays a dead row of an ordering key while a later row of its key is in
// flight at another relay, of another instance: the replayed row waits for it (claimSQL's
// "no later row of its key delivering"), and is due once that row's outcome is written.
// The relay with the replayed row's instance heard the replay's NOTIFY while the later
// row was still in flight, and claimed nothing; the outcome of the later row woke no one
// (lockNextSQL looks only for the key's rows after it), so the replayed row waited for
// that relay's next poll interval (an hour here), though due at once.
func TestLaterRowsOutcomeWakesTheRelayOfAReplayedEarlierRow(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, []outbox.Message{
		{Key: "first", Connector: "webhook", OrderingKey: "k", Payload: []int{1}},
		{Key: "second", Connector: "webhook:a", OrderingKey: "k", Payload: []int{2}},
	})
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead', attempts = 1, last_error = '422'
		WHERE idempotency_key = 'first'`)
	require.NoError(t, err)

	// Relay a has webhook:a only, and holds "second" in flight.
	cfg := separateMetrics(b.fastConfig())
	cfg.PollInterval = time.Hour
	conn := newGatedConnector()
	start(t, b.pool, cfg, map[string]Instance{"webhook:a": {Connector: conn}})
	require.Equal(t, "second", conn.waitFirst(t))

	// The other relay has webhook only; it polls hourly.
	other := b.startNotifyOnly(t)
	claims := func() uint64 {
		var m dto.Metric
		require.NoError(t, other.metrics.claimBatch.Write(&m))
		return m.GetHistogram().GetSampleCount()
	}
	before := claims()
	res, err := ops.Replay(t.Context(), b.pool, ops.Selection{Keys: []string{"first"}}, ops.ReplayOptions{Actor: "op"})
	require.NoError(t, err)
	require.Equal(t, []string{"first"}, res.Replayed)
	// The replay's NOTIFY woke the other relay, whose claim left "first" waiting for "second".
	require.Eventually(t, func() bool { return claims() > before }, waitTimeout, 10*time.Millisecond)
	in, err := outbox.Get(t.Context(), b.pool, "first")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)

	close(conn.gate) // "second" is delivered: "first" is due now
	waitStatus(t, b.pool, "second", outbox.StatusDelivered)
	afterSecond := claims()
	waitStatusWithin(t, b.pool, "first", outbox.StatusDelivered, 15*time.Second)
	require.Greater(t, claims(), afterSecond, "claimed by the other relay")
}
