package relay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// A stopping relay's recorder writes the last outcomes (writeOutcomes), retrying until
// its drain time is up, so that an outcome is not dropped while there is time. Each try
// ran with that whole time: a connection that hung during the first (no answer, no
// reset; or an idle one a firewall forgot, which the pool pings before handing it out)
// held it until the drain ended, and the outcomes were dropped, their rows left to be
// sent again once their leases ran out, though the database answered on any other
// connection. Each try is now bounded, and the next takes another connection.
func TestHungFinalRecordIsTriedAgain(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	o := claimedOutcome(t, r, direct, clock, "last")

	held, _ := proxy.holdOnce(t, "AS t(id, attempt, status") // recordSQL, never forwarded
	drain, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	written := make(chan struct{})
	go func() { r.writeOutcomes(drain, []outcome{o}); close(written) }()
	waitFor(t, held, "the outcome was never written")
	<-written
	in, err := outbox.Get(t.Context(), direct, "last")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status, "the outcome was dropped behind a hung write")
	require.Len(t, attemptsOf(t, direct, "last"), 1)
}
