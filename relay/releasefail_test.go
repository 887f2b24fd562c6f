package relay

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// While the database is away, a release of rows never sent (rows handed back, or
// queued when the relay stops) fails, and is tried again before every claim round and
// every reclaim, once a second at the default poll interval. Each failure logged a
// warning of its own, the flood the other kinds of work were spared (see Relay.failed),
// and none was counted in outboxd_database_errors_total, which the README says counts
// every failure. A failed release now goes through failed, and the next that succeeds
// says it works again.
func TestFailedReleasesAreCountedAndWarnedOnce(t *testing.T) {
	t.Parallel()
	r, proxy, logs := loggedLossyRelay(t)
	row := claimed{id: 1, attempt: 1, lease: time.Now()}

	proxy.cut()
	for range 3 {
		_, ok := r.releaseRows(t.Context(), []claimed{row})
		require.False(t, ok)
	}
	require.Equal(t, 3.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("release")), "every failure is counted")
	require.Equal(t, 1, strings.Count(logs.String(), "could not release unstarted rows"), "one warning, not one per try:\n%s", logs)

	proxy.restore()
	_, ok := r.releaseRows(t.Context(), []claimed{row})
	require.True(t, ok)
	require.Contains(t, logs.String(), "working again after failures")
}

// The hand-back of the rows claimed in rounds whose reply was lost (see releaseLost)
// failed in silence: no warning, nothing in outboxd_database_errors_total, while those
// rows stayed leased to the relay and reclaim waited for it. It now goes through failed
// as a failed release does.
func TestFailedHandBackOfLostRoundsIsCountedAndWarnedOnce(t *testing.T) {
	t.Parallel()
	r, proxy, logs := loggedLossyRelay(t)
	r.roundLease = time.Now()
	r.roundLost()

	proxy.cut()
	for range 3 {
		r.releaseAgain(t.Context())
		require.True(t, r.anyUnreleased.Load(), "tried again later")
	}
	require.Equal(t, 3.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("release")), "every failure is counted")
	require.Equal(t, 1, strings.Count(logs.String(), "rounds whose reply was lost"), "one warning, not one per try:\n%s", logs)

	proxy.restore()
	r.releaseAgain(t.Context())
	require.False(t, r.anyUnreleased.Load())
	require.Contains(t, logs.String(), "working again after failures")
}

// loggedLossyRelay is a relay (not running) whose database is reached through a
// lossyProxy, and whose log the test reads.
func loggedLossyRelay(t *testing.T) (*Relay, *lossyProxy, *logBuffer) {
	t.Helper()
	_, proxy, cfg, _ := lossySetup(t)
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	return r, proxy, logs
}
