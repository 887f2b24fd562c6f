package relay

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A failover while the relay is stopping: the pool's sessions are left on the old
// server, which takes no writes (SQLSTATE 25006), while new sessions reach the new
// primary. The claim loop, which resets the pool on such a refusal, has already
// returned; the recorder writes the outcome of the attempt that was in flight. It must
// leave the read-only sessions, as the claim loop does, and write the outcome: else the
// receiver's answer is thrown away and the row, delivered, is sent again once its lease
// expires (a second effect where the receiver does not enforce the key).
func TestStoppingRelayLeavesSessionsThatTakeNoWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	pcfg := b.pool.Config().Copy()
	pcfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	_, cfg := b.clockedConfig(t)
	cfg.Concurrency = 1
	cfg.ShutdownTimeout = time.Second // the recorder gets minRecordDrain (5 s)
	conn := newGatedConnector()
	r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	signal, stopped := runSignalled(t, r)

	enqueue(t, b.pool, "in-flight", "webhook", map[string]int{"n": 1})
	require.Equal(t, "in-flight", conn.waitFirst(t))

	signal() // SIGTERM: the claim loop returns, withdrawing the relay's words
	require.Eventually(t, func() bool {
		if !r.withdrawn.Load() {
			return false
		}
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_wake_connectors WHERE relay_id = $1`, r.cfg.ID).Scan(&n))
		return n == 0
	}, waitTimeout, 5*time.Millisecond)

	// The failover: every session of the pool is on the old server, which takes no
	// writes now; a new session would reach the new primary.
	held := takeNoWrites(t, pool)
	for _, c := range held {
		c.Release()
	}

	close(conn.gate) // the receiver answers: delivered
	stopped()

	in, err := outbox.Get(ctx, b.pool, "in-flight")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status,
		"the outcome of the attempt in flight at the stop is recorded on the new primary (last_error %v)", in.LastError)
}
