package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// The LISTEN connection was made, and its LISTEN sent, with the relay's own context,
// which has no time limit until it stops: a connection that hung at that moment (no
// answer, no reset: a partition, a firewall that forgot it, a server that accepts and
// never answers) held the LISTEN loop for as long as the kernel retransmitted, or for
// good, and meanwhile no NOTIFY woke the relay and /readyz said LISTEN was down. Making
// it is now bounded as its ping is (listenCheck), and a connection cut short is made
// again.
func TestHungListenIsCutShortAndMadeAgain(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	cfg.PollInterval = time.Hour // only NOTIFY wakes it
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	r.probeTimeout = waitTimeout
	r.listenCheck = 500 * time.Millisecond
	held, _ := proxy.holdOnce(t, "LISTEN "+notifyChannel) // never forwarded
	run(t, r)
	waitFor(t, held, "the relay never sent LISTEN")
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond,
		"LISTEN again on a new connection")
	enqueue(t, direct, "after", "webhook", []int{1})
	waitStatus(t, direct, "after", outbox.StatusDelivered) // woken by its NOTIFY
}
