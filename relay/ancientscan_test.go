package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// outbox.Enqueue takes a NotBefore as early as PostgreSQL's earliest timestamp (4714 BC).
// A claim that takes such a row starts the instance's next claims scanMargin before it,
// a time PostgreSQL cannot hold: every claim but those from the head of the index (one
// a poll interval, an hour here) failed with "timestamp out of range", and the outcomes
// riding with them were not written.
func TestClaimAfterARowDueAtTheEarliestTimestamp(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	cfg.PollInterval = time.Hour
	r := b.newRelay(t, cfg)
	_, err := outbox.Enqueue(t.Context(), b.pool, outbox.Message{Key: "ancient", Connector: "webhook",
		Payload: []int{1}, NotBefore: time.Date(-4713, 11, 24, 0, 0, 1, 0, time.UTC)})
	require.NoError(t, err)
	require.Equal(t, 1, claimOnce(t, r))

	enqueue(t, b.pool, "next", "webhook", []int{2})
	n, _, _, _, err := r.claimRound(t.Context(), nil, false)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
