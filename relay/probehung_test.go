package relay

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// The NOTIFY self-test sent its notification through the pool with the LISTEN
// connection's context, which has no time limit while that connection lasts: a pool
// connection that hung as it was sent (no answer, no reset) held the test for as long as
// the kernel retransmitted, or for good, and outboxd_notify_working said 0 meanwhile,
// though NOTIFY worked. Each send is now bounded, and sent again on another connection.
func TestHungSelfTestNotificationIsSentAgain(t *testing.T) {
	t.Parallel()
	_, proxy, cfg, _ := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	r.probeTimeout = waitTimeout
	r.listenCheck = 500 * time.Millisecond
	held, _ := proxy.holdOnce(t, "pg_notify($1, $2)") // the self-test's, never forwarded
	run(t, r)
	waitFor(t, held, "the relay never sent its self-test notification")
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond,
		"outboxd_notify_working stayed 0 behind a hung send")
}
