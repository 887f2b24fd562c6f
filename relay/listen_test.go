package relay

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
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

// An application's pool may set each connection up in BeforeConnect (a fresh IAM token
// as the password, the host of the current primary). The LISTEN connection was made
// from the pool's bare ConnConfig instead: it could not connect, so /readyz never said
// ready and NOTIFY never woke the relay, while the pool's own connections worked.
func TestListenConnectsAsThePoolDoes(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	pcfg := b.pool.Config().Copy()
	database := pcfg.ConnConfig.Database
	pcfg.ConnConfig.Database = "outboxd_no_such_database" // BeforeConnect knows the real one
	pcfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.Database = database
		return nil
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	lost := make(chan struct{})
	cfg := b.fastConfig()
	cfg.Logger = slog.New(signalHandler{want: "LISTEN connection lost", once: &sync.Once{}, seen: lost})
	r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	run(t, r)

	deadline := time.After(waitTimeout)
	for r.Ready(t.Context()) != nil {
		select {
		case <-lost:
			t.Fatalf("the LISTEN connection failed: %v", r.Ready(t.Context()))
		case <-deadline:
			t.Fatalf("the relay never got ready: %v", r.Ready(t.Context()))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// The NOTIFY self-test's notification can arrive after the self-test stopped waiting for
// it (a busy server or relay: the tests themselves wait far longer than the default 5s).
// The relay then logged that NOTIFY does not reach it and set outboxd_notify_working to
// 0, and neither changed for as long as the LISTEN connection lasted, though the
// notification came and every insert's NOTIFY woke the relay.
func TestLateSelfTestNotificationSaysNotifyWorks(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	gaveUp := make(chan struct{})
	cfg := b.fastConfig()
	cfg.Logger = slog.New(signalHandler{want: "NOTIFY DOES NOT REACH", once: &sync.Once{}, seen: gaveUp})
	r := b.newRelay(t, cfg)
	r.probeTimeout = time.Nanosecond // it stops waiting before its notification can come
	run(t, r)

	deadline := time.After(waitTimeout)
	for waiting := true; waiting; {
		select {
		case <-gaveUp:
			waiting = false
		case <-deadline:
			t.Fatal("the self-test never gave up on its notification")
		case <-time.After(100 * time.Millisecond):
			if testutil.ToFloat64(r.metrics.notifyWorking) == 1 {
				// Its notification was in already when it began to wait: test again, on
				// a new LISTEN connection.
				killListen(t, b.pool)
				require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 0 }, waitTimeout, 10*time.Millisecond)
			}
		}
	}
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond,
		"the late notification says NOTIFY reaches the relay")
}
