package relay

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// An application's pool may handle notifications itself (ConnConfig.OnNotification,
// pgconn's callback for the LISTENs of its own sessions). The LISTEN connection, made
// with the pool's settings, took that callback too, and pgx then keeps no notification
// for WaitForNotification, which returned none when one came: the relay read that
// missing notification's payload and panicked at the first NOTIFY (its own self-test),
// taking the application down with it.
func TestListenKeepsItsNotificationsFromThePoolsHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	pcfg := b.pool.Config().Copy()
	var theirs atomic.Int64
	pcfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { theirs.Add(1) }
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := b.fastConfig()
	cfg.PollInterval = time.Hour // only NOTIFY wakes it
	r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	r.probeTimeout = waitTimeout // a busy machine must not make the self-test fail
	run(t, r)
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond,
		"the self-test's NOTIFY reached the relay")

	enqueue(t, pool, "woken", "webhook", map[string]int{"i": 1})
	waitStatus(t, pool, "woken", outbox.StatusDelivered)
	require.Zero(t, theirs.Load(), "the application's callback got none of the relay's notifications")
}
