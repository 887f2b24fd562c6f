package relay

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// While the room for claimed rows is tight, only instances that hold no rows claim (see
// claimRound). A round of theirs that writes the outcome of a row with an ordering key
// must not use up the next claim from the head of the index of the instances it left
// out: the key's next row, behind where their claims start, waited for their next full
// scan (a poll interval) rather than going with their next claim.
func TestOrderedOutcomeInATightRoundLeavesARescanForTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r := newTightRelay(t, b, cfg)
	busy := r.instances["webhook"]

	_, err := outbox.EnqueueBatch(t.Context(), b.pool, []outbox.Message{
		{Key: "chain-1", Connector: "webhook", OrderingKey: "chain", Payload: []int{1}},
		{Key: "chain-2", Connector: "webhook", OrderingKey: "chain", Payload: []int{2}},
	})
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `UPDATE outbox SET next_attempt_at = now() - interval '1 hour'`)
	require.NoError(t, err)
	require.Equal(t, 1, claimOnce(t, r), "the key's first row")
	// Rows due later take the busy instance's room, until it is tight, and its claims
	// now start after the key's second row.
	fillUntilTight(t, b, r)

	// The key's first row is delivered. The round that writes its outcome claims only
	// for the idle instance (whose last claim is long enough ago).
	first := <-busy.jobs
	require.Equal(t, "chain-1", first.key)
	r.instances["webhook:idle"].tightClaimAt = time.Time{}
	o := r.decide(busy, first, json.RawMessage(`{}`), nil, clock.Now())
	o.started = clock.Now()
	_, wrote, _, _, err := r.claimRound(t.Context(), []outcome{o}, true)
	require.NoError(t, err)
	require.True(t, wrote)
	r.done(busy, first)

	// The busy instance's rows end: its next claim takes the key's second row.
	for len(busy.jobs) > 0 {
		r.done(busy, <-busy.jobs)
	}
	claimOnce(t, r)
	in, err := outbox.Get(t.Context(), b.pool, "chain-2")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "the key's next row waits for a full scan, an hour away")
}
