package relay

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// Ordering keys are one namespace for every connector, and relays sharing a database
// may have different instances. A relay that ends a row of a key lets the key's next
// row go, which it claims itself when it has that row's instance; when only another
// relay has it, nothing told that relay: idle (it polls hourly here), it found the row
// only at its next poll interval, though it was due at once.
func TestOrderedOutcomeWakesTheRelayOfTheNextRowsInstance(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	other := b.startNotifyOnly(t) // has webhook
	claims := func() uint64 {
		var m dto.Metric
		require.NoError(t, other.metrics.claimBatch.Write(&m))
		return m.GetHistogram().GetSampleCount()
	}
	before := claims()
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, []outbox.Message{
		{Key: "head", Connector: "webhook:a", OrderingKey: "k", Payload: []int{1}},
		{Key: "next", Connector: "webhook", OrderingKey: "k", Payload: []int{2}},
	})
	require.NoError(t, err)
	// The insert's NOTIFY woke the other relay, whose claim left "next" behind "head".
	require.Eventually(t, func() bool { return claims() > before }, waitTimeout, 10*time.Millisecond)

	cfg := separateMetrics(b.fastConfig())
	cfg.PollInterval = time.Hour
	start(t, b.pool, cfg, map[string]Instance{"webhook:a": {Connector: b.hook}})
	waitStatus(t, b.pool, "head", outbox.StatusDelivered)
	in := waitStatus(t, b.pool, "next", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts)
	require.Equal(t, other.ID(), attemptsOf(t, b.pool, "next")[0].RelayID)
}

// The wake-up is for next rows of another relay's instances only: one of this relay's
// own instances, which its claims find, sends no NOTIFY (each would serialise the
// round's commit with every other transaction that notifies, and wake every relay). In
// every query exec mode (behind a transaction pooler, the simple protocol).
func TestNextRowOfOwnInstanceSendsNoNotify(t *testing.T) {
	t.Parallel()
	for _, mode := range append([]pgx.QueryExecMode{pgx.QueryExecModeCacheStatement}, pgtest.ExecModes...) {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			pool := pgtest.InMode(t, b.pool, mode)
			_, err := outbox.EnqueueBatch(t.Context(), b.pool, []outbox.Message{
				{Key: "head", Connector: "webhook", OrderingKey: "k", Payload: []int{1}},
				{Key: "next", Connector: "webhook", OrderingKey: "k", Payload: []int{2}},
			})
			require.NoError(t, err)
			var head int64
			require.NoError(t, b.pool.QueryRow(t.Context(),
				`UPDATE outbox SET status = 'delivered' WHERE idempotency_key = 'head' RETURNING id`).Scan(&head))
			notified := listenFor(t, b)
			for notified() { // the insert's own
			}

			for _, c := range []struct {
				own  []string
				wake bool
			}{
				{[]string{"webhook", "webhook:a"}, false},
				{[]string{"webhook:a"}, true},
				{[]string{}, true}, // a relay asked to stop
			} {
				_, err := pool.Exec(t.Context(), lockNextSQL, []int64{head}, c.own)
				require.NoError(t, err)
				require.Equal(t, c.wake, notified(), "own instances %v", c.own)
			}
		})
	}
}
