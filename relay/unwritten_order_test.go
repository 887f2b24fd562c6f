package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// The relay's own reclaim leaves a row whose outcome it holds (see
// TestOwnReclaimLeavesARowWhoseOutcomeItHolds); when that row has an ordering key and
// the key's next row was parked behind it in flight, the outcome, written once the
// database returns, ends the row and must release the next row at once.
func TestOutcomeOfARowReclaimLeftReleasesTheNextRow(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	cfg.Concurrency = 1
	conn := newGatedConnector()
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: refusingGatedConnector{conn}}})
	require.NoError(t, err)
	r.parkBehindMin = 1
	enqueueOrdered(t, direct, "head", "k")
	enqueueOrdered(t, direct, "next", "k")
	run(t, r)
	conn.waitFirst(t)
	r.parkInFlight(t.Context())
	require.Eventually(t, func() bool {
		in, err := outbox.Get(t.Context(), direct, "next")
		return err == nil && in.LastError != ""
	}, waitTimeout, time.Millisecond, "next parked behind head")

	proxy.cut()
	clock.Advance(r.cfg.Lease + time.Second)
	close(conn.gate)
	require.Eventually(t, func() bool { return r.claimedRows.Load() == 0 }, waitTimeout, time.Millisecond)
	held, release := proxy.holdOnce(t, "AS t(id, attempt, status")
	proxy.restore()
	waitFor(t, held, "the outcome was never written again")
	r.reclaim(t.Context())
	release()
	waitStatus(t, direct, "head", outbox.StatusDead)
	in := waitStatus(t, direct, "next", outbox.StatusDead)
	require.Equal(t, 1, in.Attempts)
}
