package relay

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// The claim loop salvages a batch of outcomes the database refused (see salvage) with
// its own context, which has no time limit until the relay stops, and writes no other
// outcome and claims no row until salvage returns. A write of salvage whose connection
// hangs (the request never reaches PostgreSQL, and no reset comes) must be cut short as
// a round is, its outcome left to be written again, rather than hold the loop, while the
// leases of the rows the relay sent run out and other relays send them again.
func TestHungSalvageWriteIsCutShort(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	r.salvageTimeout = time.Second
	o := claimedOutcome(t, r, direct, clock, "salvaged")

	held, release := proxy.holdOnce(t, "AS t(id, attempt, status") // recordSQL, never forwarded
	left := make(chan []outcome, 1)
	go func() { left <- r.salvage(t.Context(), []outcome{o}, errors.New("refused")) }()
	waitFor(t, held, "salvage never wrote the outcome")
	select {
	case got := <-left:
		require.Len(t, got, 1, "the write's fate is unknown: it is retried")
		require.True(t, got[0].maybeWritten)
		// The connection comes back and the held write goes on: written again, the
		// outcome is recorded, and its attempt logged once.
		release()
		r.writeOutcomes(t.Context(), got)
		in, err := outbox.Get(t.Context(), direct, "salvaged")
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, in.Status)
		require.Len(t, attemptsOf(t, direct, "salvaged"), 1)
	case <-time.After(waitTimeout):
		release() // lets salvage, and the test, end
		<-left
		t.Fatal("salvage waited for a hung connection: the claim loop would write no outcome and claim no row")
	}
}
