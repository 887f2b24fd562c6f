package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// Run's start retries its reads for a while (a relay started alongside its database
// waits for it), but each try ran with Run's context, which has no time limit: a
// connection that hung during a read (no answer, no reset) held the start for as long
// as the kernel retransmitted, or for good, the relay neither running nor failing, and
// /readyz saying it was starting. Each try is now bounded, and the next takes another
// connection.
func TestHungReadAtStartIsCutShortAndTriedAgain(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	held, _ := proxy.holdOnce(t, "server_version_num") // never forwarded
	run(t, r)
	waitFor(t, held, "the relay never read the server's version")
	require.Eventually(t, r.running.Load, waitTimeout, 10*time.Millisecond, "the relay never started")
	enqueue(t, direct, "after", "webhook", []int{1})
	waitStatus(t, direct, "after", outbox.StatusDelivered)
}
