package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// While the room for claimed rows is tight, an instance that holds no rows claims at
// most every tightClaimEvery. A round that leaves it out for that reason (a NOTIFY woke
// the loop for its new row just after its last claim) must say when to look again: the
// claim loop otherwise waits for the next wake-up, and with the other instance's
// attempts hanging, that is the next poll, while the row waits.
func TestTightRoomSkipSaysWhenToClaimAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r := newTightRelay(t, b, cfg)
	fillUntilTight(t, b, r)

	// The idle instance has just claimed (nothing); its row arrives, and wakes the loop.
	// Its last claim is stamped a minute ahead, so that however slow the machine, the
	// round comes within tightClaimEvery of it.
	enqueue(t, b.pool, "woken", "webhook:idle", []int{1})
	r.instances["webhook:idle"].tightClaimAt = time.Now().Add(time.Minute)
	claimed, _, _, retryIn, err := r.claimRound(t.Context(), nil, false)
	require.NoError(t, err)
	require.Zero(t, claimed)
	require.Positive(t, retryIn, "nothing would look for the row again before the next poll, an hour away")
	require.LessOrEqual(t, retryIn, time.Minute+tightClaimEvery)
}

// newTightRelay is a relay with instances webhook and webhook:idle, connectors without a
// time limit (so no rows are claimed ahead, and the room is the concurrency, 12), and no
// full scan but the ones the rows ask for (a poll interval of an hour).
func newTightRelay(t *testing.T, b *testBundle, cfg *Config) *Relay {
	t.Helper()
	cfg.PollInterval = time.Hour
	cfg.Concurrency = 12
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: guaranteed{connectors.Enforced}},
		"webhook:idle": {Connector: guaranteed{connectors.Enforced}},
	})
	require.NoError(t, err)
	return r
}

// fillUntilTight gives instance webhook rows, due later than those before, until the
// room for claimed rows is below a quarter.
func fillUntilTight(t *testing.T, b *testBundle, r *Relay) {
	t.Helper()
	fill := make([]outbox.Message, 2*r.cfg.Concurrency)
	for i := range fill {
		fill[i] = outbox.Message{Key: fmt.Sprintf("fill-%d", i), Connector: "webhook", Payload: []int{i}}
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, fill)
	require.NoError(t, err)
	for claimOnce(t, r) > 0 {
	}
	require.Less(t, r.maxClaimed-int(r.claimedRows.Load()), r.maxClaimed/4, "the room is tight")
}
