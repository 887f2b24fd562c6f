package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// An instance whose ambiguous attempts are held claims no rows ahead: should the relay
// die, rows claimed and not sent come back ambiguous when their lease expires, held,
// each for a person, though nothing was sent. It claimed all its workers could take all
// the same while another instance's slow attempts held every shared slot: only its own
// slot could take one, and the others waited (up to startBy, then handed back, claimed
// again, ...) under a lease, for as long as the slow attempts lasted. Now one waits at
// most, for the next slot to come free.
func TestHoldInstanceClaimsNoRowsThatNoFreeSlotCanTake(t *testing.T) {
	t.Parallel()
	slowHook, slow, releaseSlow := newSlowHook(t)
	holdRcv, releaseHold := blockingReceiver(t)
	holdHook, err := webhook.New(webhook.Config{URL: holdRcv.URL(), Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
	require.NoError(t, err)
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t) // the clock stands still: no row is handed back meanwhile
	cfg.Concurrency = 8              // six shared slots, and one kept for each instance
	cfg.Lease = time.Hour + 25*time.Second
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook:slow": {Connector: slowHook},
		"webhook:hold": {Connector: holdHook, OnAmbiguous: AmbiguousHold},
	})
	require.NoError(t, err)
	runWorkers(t, r, releaseSlow, releaseHold)
	hold := r.instances["webhook:hold"]
	require.Equal(t, 7, hold.limit)

	for i := range 7 {
		enqueue(t, b.pool, fmt.Sprintf("slow-%d", i), "webhook:slow", []int{i})
	}
	require.Equal(t, 7, claimOnce(t, r))
	require.Eventually(t, func() bool { return slow.TotalEffects() == 7 }, waitTimeout, 10*time.Millisecond,
		"the slow attempts hold the six shared slots and their own")

	msgs := make([]outbox.Message, 7)
	keys := make([]string, 7)
	for i := range msgs {
		keys[i] = fmt.Sprintf("hold-%d", i)
		msgs[i] = outbox.Message{Key: keys[i], Connector: "webhook:hold", Payload: []int{i}}
	}
	_, err = outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	claimed := claimOnce(t, r)
	require.Eventually(t, func() bool { return holdRcv.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond,
		"one hold row goes out on the instance's own slot")
	claimed += claimOnce(t, r) // and rounds after, while the slots stay taken
	claimed += claimOnce(t, r)

	// The relay dies now (it is left as it is): another relay, once the leases have
	// expired, puts its rows back, and holds each for an operator as an ambiguous attempt.
	other, err := New(b.pool, &Config{ID: "other", Logger: testLogger(),
		NowFunc: func() time.Time { return clock.Now().Add(cfg.Lease + time.Hour) }},
		map[string]Instance{"webhook:hold": {Connector: holdHook, OnAmbiguous: AmbiguousHold}})
	require.NoError(t, err)
	other.reclaim(t.Context())
	var heldUnsent []string
	for _, key := range keys {
		in, err := outbox.Get(t.Context(), b.pool, key)
		require.NoError(t, err)
		if in.Status == outbox.StatusHeld && holdRcv.Requests(key) == 0 {
			heldUnsent = append(heldUnsent, key)
		}
	}
	require.LessOrEqual(t, len(heldUnsent), 1, "held for an operator, though never sent: %v (claimed %d rows, %d sent)",
		heldUnsent, claimed, holdRcv.TotalEffects())
	require.LessOrEqual(t, claimed, 2, "the row in flight on the instance's own slot, and one waiting for the next slot")
}
