package relay

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"

	"github.com/outboxd/outboxd/outbox"
)

// A hand-back whose release committed but whose reply was lost is tried again before a
// later round (releaseAgain). By then the row may have been claimed again, by the same
// attempt number, and given to a worker: the retried release must leave that newer
// claim alone, or the row goes back to pending while it is being sent, and another
// relay sends it too.
func TestRetriedReleaseLeavesANewerClaimAlone(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	enqueue(t, direct, "twice", "webhook", []int{1})
	first := claimRows(t, r, "webhook")
	require.Len(t, first, 1)

	proxy.arm("AS r(id, attempt", nil) // releaseSQL
	r.release(first)
	waitKilled(t, proxy)
	require.True(t, r.anyUnreleased.Load(), "the release is to be tried again")
	in, err := outbox.Get(t.Context(), direct, "twice")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status, "the release committed")

	// The next round claims the row again, for the same attempt, and a worker has it.
	again := claimRows(t, r, "webhook")
	require.Len(t, again, 1)
	require.Equal(t, first[0].attempt, again[0].attempt)

	r.releaseAgain() // the claim loop, before its next round
	in, err = outbox.Get(t.Context(), direct, "twice")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "the newer claim, in a worker's hands, stands")
}

// salvage writes a refused outcome alone, without its answer. When that write commits
// and its reply is lost, the outcome is written again: it must be written with
// recordAgainSQL, so that the attempt is logged once.
func TestSalvagedOutcomeWrittenAgainIsLoggedOnce(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	enqueue(t, direct, "salvaged", "webhook", []int{1})
	got := claimRows(t, r, "webhook")
	require.Len(t, got, 1)
	now := clock.Now()
	o := outcome{id: got[0].id, attempt: got[0].attempt, status: statusDelivered, result: []byte(`{"ok":true}`),
		started: now, finished: now, record: statusDelivered}

	proxy.arm("AS t(id, attempt, status", nil) // recordSQL
	left := r.salvage(t.Context(), []outcome{o}, errors.New("refused"))
	waitKilled(t, proxy)
	require.Len(t, left, 1, "the write's fate is unknown: it is retried")
	r.writeOutcomes(t.Context(), left)

	in, err := outbox.Get(t.Context(), direct, "salvaged")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status)
	att := attemptsOf(t, direct, "salvaged")
	require.Len(t, att, 1, "attempts log: %+v", att)
}

// The outcome of a row with an ordering key, in a batch PostgreSQL refuses, is written
// by salvage (claimLoop's refused branch), without a claim: the next claim must still
// start at the head of the index, where the key's next row may lie, as it does when
// claimRound writes such an outcome without a claim.
func TestOrderedOutcomeSalvagedRescansNextTime(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	enqueueOrdered(t, b.pool, "k-1", "k")
	rows := claimRows(t, r, "webhook")
	require.Len(t, rows, 1)
	out := r.decide(r.instances["webhook"], rows[0], json.RawMessage(`{"n": 1e1000000}`), nil, r.now())
	out.started = r.now()

	r.rescan.Store(false)
	r.claimedRows.Store(int64(r.maxClaimed)) // no room: the round only writes the outcome
	_, _, _, _, err = r.claimRound(t.Context(), []outcome{out}, true)
	require.True(t, refused(err), "the batch is refused: %v", err)
	require.Empty(t, r.salvage(t.Context(), []outcome{out}, err), "claimLoop's refused branch")
	in, err := outbox.Get(t.Context(), b.pool, "k-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status)
	require.True(t, r.rescan.Load(), "the next claim starts at the head of the index")
}
