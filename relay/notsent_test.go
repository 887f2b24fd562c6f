package relay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A write that never went out, because the relay had no connection to send it on (the
// database is unreachable, or the write's context ended while it waited for one), was
// taken as one whose reply was lost: its outcomes were marked as perhaps written
// (recordAgainSQL from then on) and, in the claim loop, the round's lease was kept to
// be handed back, one more for each round of an outage.
func TestWriteThatNeverWentOutIsNotTakenAsLost(t *testing.T) {
	t.Parallel()
	_, proxy, cfg, clock := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	now := clock.Now()
	outs := []outcome{{id: 1, attempt: 1, status: statusDelivered, started: now, finished: now, record: statusDelivered}}

	proxy.cut() // no connection can be made
	err = r.execRecord(t.Context(), outs, r.recordArgs(outs))
	require.Error(t, err)
	require.False(t, unsure(err), "an outcome write with no connection: %v", err)
	_, err = r.claimAndRecord(t.Context(), []claimPlan{{inst: r.instances["webhook"], limit: 10, bytes: 1 << 20}}, outs)
	require.Error(t, err)
	require.False(t, unsure(err), "a round with no connection: %v", err)

	proxy.restore()
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // ended before the write could go out
	err = r.execRecord(ctx, outs, r.recordArgs(outs))
	require.Error(t, err)
	require.False(t, unsure(err), "an outcome write whose context had ended: %v", err)
}
