package relay

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A LISTEN connection that died without a reset (a NAT gateway or load balancer that
// dropped it while no notification came, the old primary's host gone after a failover)
// delivers nothing and reports nothing until TCP keepalive gives up, most of an hour
// with pgx's defaults. It was never looked at: /readyz said LISTEN was up and
// outboxd_notify_working said 1 while no NOTIFY woke the relay, and rows waited for
// the poll. A LISTEN connection silent for a while is now pinged, and made again when
// the ping gets no answer.
func TestDeadListenConnectionIsFoundAndMadeAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	path := pgtest.NewPath(t, b.pool)
	path.Watch("LISTEN " + notifyChannel)
	lost := make(chan struct{})
	cfg := b.fastConfig()
	cfg.PollInterval = time.Hour // only NOTIFY wakes it
	cfg.Logger = slog.New(signalHandler{want: listenLost, once: &sync.Once{}, seen: lost})
	r, err := New(path.Pool(t, b.pool), cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	r.probeTimeout = waitTimeout
	r.listenCheck = 500 * time.Millisecond
	run(t, r)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond)

	path.BlackHole() // the LISTEN connection, as a NAT gateway that forgot it
	waitFor(t, lost, "the dead LISTEN connection was never found: /readyz said LISTEN was up")
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond,
		"LISTEN again on a new connection")
	enqueue(t, b.pool, "after", "webhook", []int{1})
	waitStatus(t, b.pool, "after", outbox.StatusDelivered) // woken by its NOTIFY
}
