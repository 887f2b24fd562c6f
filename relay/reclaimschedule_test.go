package relay

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// Reclaiming expired leases ran every poll interval only, so an operator who raised
// OUTBOX_POLL_INTERVAL because NOTIFY works (to a minute, or an hour) delayed by as
// much the return of a dead relay's rows beyond their lease. It now runs at least every
// reclaimInterval, here shortened (reclaimAtMost) since the relay's tickers are real
// time; the lease runs out on the injected clock.
func TestReclaimRunsWithinItsBoundUnderALongPollInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.PollInterval = time.Hour
	instances := map[string]Instance{"webhook": {Connector: b.hook}}

	gone := newRelayAs(t, b, cfg, instances, "gone")
	enqueue(t, b.pool, "orphan", "webhook", []int{1})
	require.Len(t, claimRows(t, gone, "webhook"), 1, "the relay that dies claims the row and never sends it")

	survivor := newRelayAs(t, b, cfg, instances, "survivor")
	require.Equal(t, reclaimInterval, survivor.reclaimAtMost)
	survivor.reclaimAtMost = 50 * time.Millisecond
	run(t, survivor)
	// Its first pass at start, before the lease runs out, found nothing to put back: the
	// row gauges are set once it has run (reclaim comes before their refresh).
	require.Eventually(t, func() bool { return testutil.CollectAndCount(survivor.metrics.rows) > 0 }, waitTimeout,
		5*time.Millisecond, "the first periodic work ran")
	got, err := outbox.Get(t.Context(), b.pool, "orphan")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, got.Status, "the lease has not run out yet")

	clock.Advance(survivor.cfg.Lease + time.Second)
	waitStatus(t, b.pool, "orphan", outbox.StatusDelivered)
	var abandoned int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_attempts a JOIN outbox o ON o.id = a.outbox_id
		WHERE o.idempotency_key = 'orphan' AND a.outcome = 'lease_expired' AND a.ambiguous AND a.relay_id = 'gone'`).Scan(&abandoned))
	require.Equal(t, 1, abandoned, "put back by a reclaim, its abandoned attempt logged as ambiguous, long before the next poll")
}
