package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A receiver that hangs: its instance's workers all wait, and the relay claims its rows
// ahead of them (its attempts' pace is not known yet: none has ended). Those rows must
// not take all the room the relay has for claimed rows, or the other instances' rows are
// not claimed until the slow instance's are handed back (up to startBy, 5s, later; and
// again after each of its claims while its attempts last). Here the clock stands still,
// so they never are.
func TestSlowInstanceRowsClaimedAheadLeaveRoomForOthers(t *testing.T) {
	t.Parallel()
	slowHook, slow, release := newSlowHook(t)
	defer release()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t) // the clock stands still: no row is ever too late to start
	cfg.Concurrency = 8
	cfg.Lease = time.Hour + 25*time.Second
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook},
	})
	inst := r.instances["webhook:slow"]

	var msgs []outbox.Message
	for i := range 300 {
		msgs = append(msgs, outbox.Message{Key: fmt.Sprintf("slow-%d", i), Connector: "webhook:slow", Payload: []int{i}})
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slow.TotalEffects() == inst.limit }, waitTimeout, 10*time.Millisecond)
	// The slow instance has claimed all it will while its attempts hang.
	var last int64 = -1
	require.Eventually(t, func() bool {
		n := inst.claimed.Load()
		settled := n == last
		last = n
		return settled
	}, waitTimeout, 200*time.Millisecond)

	enqueue(t, b.pool, "fast", "webhook", []int{1})
	require.Eventually(t, func() bool { return b.receiver.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond,
		"the fast row is never claimed: the slow instance holds %d claimed rows, the relay %d of at most %d",
		inst.claimed.Load(), r.claimedRows.Load(), r.maxClaimed)
}

// Two receivers that hang: each instance's rows claimed ahead leave room, but a round
// in which only they claimed (the third, rate-limited, instance waited for its token)
// shared all the room between them, and the third instance's rows were not claimed at
// all, token or not, until theirs were handed back (up to startBy later, and again
// after each of their claims while their attempts last): a round claimed nothing with
// no room left. An instance that holds no rows claims a row all the same.
func TestTwoSlowInstancesRowsClaimedAheadLeaveRoomForOthers(t *testing.T) {
	t.Parallel()
	slowHook1, _, release1 := newSlowHook(t)
	defer release1()
	slowHook2, _, release2 := newSlowHook(t)
	defer release2()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Concurrency = 8
	cfg.Lease = time.Hour + 25*time.Second
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook":       {Connector: b.hook, Rate: 1},
		"webhook:slow1": {Connector: slowHook1},
		"webhook:slow2": {Connector: slowHook2},
	})
	require.NoError(t, err)
	paced := r.instances["webhook"]
	paced.limiter.AllowN(r.cfg.NowFunc(), 1) // its request has just gone

	var msgs []outbox.Message
	for i := range 300 {
		msgs = append(msgs, outbox.Message{Key: fmt.Sprintf("slow1-%d", i), Connector: "webhook:slow1", Payload: []int{i}},
			outbox.Message{Key: fmt.Sprintf("slow2-%d", i), Connector: "webhook:slow2", Payload: []int{i}})
	}
	_, err = outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	enqueue(t, b.pool, "paced", "webhook", []int{1})
	for claimOnce(t, r) > 0 {
	}
	clock.Advance(time.Second) // its next token
	claimed := 0
	require.Eventually(t, func() bool { // every tightClaimEvery at most
		claimed += claimOnce(t, r)
		return paced.claimed.Load() == 1
	}, waitTimeout, 10*time.Millisecond,
		"the paced row is never claimed: the slow instances hold %d and %d claimed rows, the relay %d of at most %d",
		r.instances["webhook:slow1"].claimed.Load(), r.instances["webhook:slow2"].claimed.Load(), r.claimedRows.Load(), r.maxClaimed)
	require.Equal(t, 1, claimed, "the slow instances claim no more")
}
