package relay

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// outboxd_commit_to_delivery_seconds tells a lag of minutes from one of an hour: rows
// delivered after an outage, a backlog or their retries (backoff up to an hour, for up
// to OUTBOX_MAX_AGE) are late by that much. Its buckets ended at 60 seconds, so every
// such row fell in +Inf, and histogram_quantile said 60 s of a p99 of an hour: an alert
// on a lag of five minutes could never fire.
func TestCommitToDeliveryTellsLongLagsApart(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	// Committed, and due, 2 and 70 minutes ago: the relay was away meanwhile.
	_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, created_at, next_attempt_at)
		VALUES ('two-minutes', 'webhook', '{}', now() - interval '2 minutes', now() - interval '2 minutes'),
		       ('seventy-minutes', 'webhook', '{}', now() - interval '70 minutes', now() - interval '70 minutes')`)
	require.NoError(t, err)
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	waitStatus(t, b.pool, "two-minutes", outbox.StatusDelivered)
	waitStatus(t, b.pool, "seventy-minutes", outbox.StatusDelivered)

	mfs, err := b.registry.Gather()
	require.NoError(t, err)
	var below5m, below2h uint64 // rows in the buckets up to 5 minutes, and up to 2 hours
	for _, mf := range mfs {
		if mf.GetName() != "outboxd_commit_to_delivery_seconds" {
			continue
		}
		require.Len(t, mf.GetMetric(), 1)
		h := mf.GetMetric()[0].GetHistogram()
		require.EqualValues(t, 2, h.GetSampleCount())
		for _, bk := range h.GetBucket() {
			ub := bk.GetUpperBound()
			if ub <= 5*60 && !math.IsInf(ub, 1) {
				below5m = max(below5m, bk.GetCumulativeCount())
			}
			if ub <= 2*60*60 {
				below2h = max(below2h, bk.GetCumulativeCount())
			}
		}
	}
	require.EqualValues(t, 1, below5m, "the row two minutes late is in a bucket of its own, up to 5 minutes")
	require.EqualValues(t, 2, below2h, "the row 70 minutes late is in a bucket up to 2 hours, not only in +Inf")
}
