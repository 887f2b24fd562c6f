package relay

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// The NOTIFY self-test's own statement fails (the pool's connection breaks, as it does
// for a while after PostgreSQL restarts). It was not tried again: the self-test gave up
// with a warning, and outboxd_notify_working said 0, "relying on polling", for as long
// as that LISTEN connection lasted, although NOTIFY reached the relay.
func TestNotifySelfTestIsSentAgainAfterItFails(t *testing.T) {
	t.Parallel()
	_, proxy, cfg, _ := lossySetup(t)
	proxy.arm("pg_notify", nil) // the self-test's reply is lost, its connection broken
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	r.probeTimeout = waitTimeout // a busy machine must not make the self-test fail
	run(t, r)

	waitKilled(t, proxy)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, 10*time.Second, 10*time.Millisecond,
		"the self-test is sent again, and NOTIFY is found to work")
}
