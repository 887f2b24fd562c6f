package relay

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A database (or role) with idle_session_timeout set ends every session idle that long,
// the relay's LISTEN connection among them: it only waits for notifications, and sends
// nothing but a ping every listenCheck (30s). With a timeout shorter than that, the
// LISTEN connection was ended again and again, the relay warning "LISTEN connection
// lost", /readyz failing and outboxd_notify_working at 0 while it was made again.
func TestListenConnectionOutlivesIdleSessionTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	var db string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT current_database()`).Scan(&db))
	_, err := b.pool.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET idle_session_timeout = '500ms'`)
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(t.Context(), b.pool.Config().Copy()) // new sessions take the setting
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	lost := make(chan struct{})
	cfg := b.fastConfig()
	cfg.PollInterval = time.Hour // only NOTIFY wakes it
	cfg.Logger = slog.New(signalHandler{want: listenLost, once: &sync.Once{}, seen: lost})
	r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	r.probeTimeout = waitTimeout
	run(t, r)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)

	// A LISTEN session made more than 2s ago, and still there, four times the timeout: the server
	// would have ended it at 500ms.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND query IN ('LISTEN `+notifyChannel+`', '-- ping') AND backend_start < now() - interval '2s'`).Scan(&n))
		return n > 0
	}, waitTimeout, 50*time.Millisecond, "no LISTEN session outlived idle_session_timeout")
	select {
	case <-lost:
		t.Fatal("the relay lost its LISTEN connection to idle_session_timeout")
	default:
	}
	enqueue(t, b.pool, "after", "webhook", []int{1})
	waitStatus(t, b.pool, "after", outbox.StatusDelivered) // woken by its NOTIFY
}
