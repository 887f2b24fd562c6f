package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// A round's claim is still running in the database when the relay gives up on its reply
// (here it waits at its commit for a lock, as a claim can wait behind outboxd migrate's
// index build or any long lock, and its connection breaks with pgx's cancel request):
// the relay takes the round as lost and hands its rows back once the database answers.
// That hand-back used to find nothing, since the claim had not committed yet, and the
// relay forgot the round; the claim then committed, and its row stayed leased to the
// relay, never sent, until the lease expired and it came back as an ambiguous attempt
// (held for an operator with the hold policy, dead on its last attempt). The relay now
// ends the lost round's session first (see fence), so the claim never commits.
func TestLostClaimIsEndedBeforeItsRowsAreHandedBack(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	b := &testBundle{pool: direct}
	ctx := t.Context()
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	// The claim of "stranded" waits at its commit until the test lets it go.
	unlock, waiting := blockAtCommit(t, b.pool, "stranded", "delivering")

	enqueue(t, b.pool, "stranded", "webhook", []int{1})
	roundCtx := ctx
	done := make(chan error, 1)
	go func() {
		_, err := r.claimAndRecord(roundCtx, []claimPlan{{inst: r.instances["webhook"], limit: 10, bytes: 1 << 20}}, nil)
		done <- err
	}()
	require.Eventually(t, func() bool { return waiting("advisory") == 1 }, waitTimeout, 10*time.Millisecond, "the claim waits at its commit")
	// The network between relay and database breaks (and so does pgx's cancel request,
	// which would otherwise abort the claim), then heals.
	proxy.partition()
	err = <-done
	require.Error(t, err)
	require.True(t, unsure(err), "%v", err)
	proxy.restore()
	r.roundLost() // what the claim loop does with a round whose reply it never got
	r.releaseAgain(ctx)
	require.False(t, r.anyUnreleased.Load(), "handed back")
	require.Equal(t, 0, waiting("advisory"), "the lost claim's session was ended, not left to commit")
	unlock()

	in, err := outbox.Get(ctx, b.pool, "stranded")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status,
		"a row no worker saw is not left leased to the relay, to come back as an ambiguous attempt when its lease expires")
	require.Zero(t, in.Attempts)
}
