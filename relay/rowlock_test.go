package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// Another session locks a row in flight and keeps the lock (psql's BEGIN; SELECT ...
// FOR UPDATE left open). The write of that row's outcome waits for it; it rode in one
// transaction with every other outcome and the claims, so the whole relay stood still,
// round after round cut at roundTimeout, while the leases of what it held ran out. Now
// the lock holds up only that outcome: the other rows are delivered and recorded, new
// rows are claimed, and once the lock is let go the held outcome is written, its
// attempt logged once and the receiver's effect made once.
func TestRowLockedByAnotherSessionHoldsUpOnlyItsOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	logs := &logBuffer{}
	cfg := b.fastConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	gate := &afterEffectGate{Connector: b.hook, key: "locked", acted: make(chan struct{}), open: make(chan struct{})}
	r, _ := start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: gate}})

	locked := enqueue(t, b.pool, "locked", "webhook", []int{1})
	waitFor(t, gate.acted, "the row was never sent")
	// In flight, its claim committed: another session locks it, and keeps the lock.
	locker := lockRow(t, b.pool, locked.ID)
	close(gate.open)
	waitForLockWait(t, b.pool, r, locker)

	requireOthersGoOn(t, b, "free")
	in, err := outbox.Get(t.Context(), b.pool, "locked")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "its outcome waits for the lock")
	require.Empty(t, attemptsOf(t, b.pool, "locked"))
	require.Contains(t, logs.String(), fmt.Sprintf("id=%d key=locked", locked.ID), "the warning names the row")
	require.Contains(t, logs.String(), "another database session holds a lock on this row")
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("record")), "counted once")

	require.NoError(t, locker.Rollback(t.Context()))
	waitStatus(t, b.pool, "locked", outbox.StatusDelivered)
	got := attemptsOf(t, b.pool, "locked")
	require.Len(t, got, 1, "%+v", got)
	require.Equal(t, statusDelivered, got[0].Outcome)
	require.Equal(t, 1, b.receiver.Effects("locked"))
	require.Equal(t, 1, strings.Count(logs.String(), "another database session holds a lock on this row"),
		"said once, not at every look")
}

// The same with a lock on the next row of an ordering key: the write of the outcome of
// the key's row in flight, which makes the next row due (lockNextSQL), waits for it. It
// holds up that key only.
func TestNextRowLockedByAnotherSessionHoldsUpOnlyItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	enqueueOrdered(t, b.pool, "head", "order-7")
	next := enqueueOrdered(t, b.pool, "next", "order-7")
	locker := lockRow(t, b.pool, next.ID)
	r, _ := start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	waitForLockWait(t, b.pool, r, locker)

	requireOthersGoOn(t, b, "unordered")
	for key, status := range map[string]string{"head": outbox.StatusDelivering, "next": outbox.StatusPending} {
		in, err := outbox.Get(t.Context(), b.pool, key)
		require.NoError(t, err)
		require.Equal(t, status, in.Status, key)
	}
	require.Equal(t, 1, b.receiver.Effects("head"))

	require.NoError(t, locker.Rollback(t.Context()))
	waitStatus(t, b.pool, "next", outbox.StatusDelivered)
	for _, key := range []string{"head", "next"} {
		got := attemptsOf(t, b.pool, key)
		require.Len(t, got, 1, "%s: %+v", key, got)
		require.Equal(t, statusDelivered, got[0].Outcome, key)
		require.Equal(t, 1, b.receiver.Effects(key), key)
	}
}

// A write of outcomes waits at most recordLockWait for a lock, in every query exec mode
// the relay supports (the setting must hold for the whole batch, which is one
// transaction), and the setting ends with it: it never stays on a session of the pool,
// which an application embedding the relay may share.
func TestRecordLockWaitHoldsForTheBatchOnly(t *testing.T) {
	t.Parallel()
	for _, mode := range append([]pgx.QueryExecMode{pgx.QueryExecModeCacheStatement}, pgtest.ExecModes...) {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			pool := pgtest.InMode(t, b.pool, mode)
			clock, cfg := b.clockedConfig(t)
			r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
			require.NoError(t, err)
			o := claimedOutcome(t, r, b.pool, clock, "locked")
			var before string
			require.NoError(t, pool.QueryRow(t.Context(), `SHOW lock_timeout`).Scan(&before))

			locker := lockRow(t, b.pool, o.id)
			// Bounded well beyond recordLockWait, only so that a write that waits for the
			// lock fails the test rather than hang it.
			ctx, cancel := context.WithTimeout(t.Context(), waitTimeout/2)
			defer cancel()
			err = r.execRecord(ctx, []outcome{o}, r.recordArgs([]outcome{o}))
			require.True(t, lockTimedOut(err), "the write waited for the lock: %v", err)
			for _, conn := range pool.AcquireAllIdle(t.Context()) { // the write's among them
				var setting string
				require.NoError(t, conn.QueryRow(t.Context(), `SHOW lock_timeout`).Scan(&setting))
				conn.Release()
				require.Equal(t, before, setting, "the lock wait outlived its write")
			}

			require.NoError(t, locker.Rollback(t.Context()))
			require.NoError(t, r.execRecord(t.Context(), []outcome{o}, r.recordArgs([]outcome{o})))
			in, err := outbox.Get(t.Context(), b.pool, "locked")
			require.NoError(t, err)
			require.Equal(t, outbox.StatusDelivered, in.Status)
		})
	}
}

// afterEffectGate is a webhook connector whose delivery of key, once the receiver has
// acted on it, closes acted and waits for open.
type afterEffectGate struct {
	*webhook.Connector
	key   string
	once  sync.Once
	acted chan struct{}
	open  chan struct{}
}

func (g *afterEffectGate) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	res, err := g.Connector.Deliver(ctx, d)
	if d.Key == g.key {
		g.once.Do(func() { close(g.acted) })
		select {
		case <-g.open:
		case <-ctx.Done(): // the relay stops (a test that failed before it opened)
		}
	}
	return res, err
}

// lockRow locks row id in a transaction of another session, which the test rolls back
// (or its cleanup does).
func lockRow(t *testing.T, pool *pgxpool.Pool, id int64) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) })
	var got int64
	require.NoError(t, tx.QueryRow(t.Context(), `SELECT id FROM outbox WHERE id = $1 FOR UPDATE`, id).Scan(&got))
	return tx
}

// waitForLockWait waits until r's write of an outcome has met the lock that locker
// holds: a session of r's waits for locker, or r has said it set the outcome aside.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, r *Relay, locker pgx.Tx) {
	t.Helper()
	pid := locker.Conn().PgConn().PID()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(t.Context(),
			`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, pid).Scan(&waiting)
		return err == nil && (waiting || testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("record")) > 0)
	}, waitTimeout, 5*time.Millisecond, "the outcome's write never met the lock")
}

// requireOthersGoOn enqueues rows of its own, with keys starting with prefix, and
// requires them delivered and recorded once each, and then more rows, claimed after.
func requireOthersGoOn(t *testing.T, b *testBundle, prefix string) {
	t.Helper()
	for wave := range 2 {
		var keys []string
		for i := range 3 {
			key := fmt.Sprintf("%s-%d-%d", prefix, wave, i)
			enqueue(t, b.pool, key, "webhook", []int{i})
			keys = append(keys, key)
		}
		for _, key := range keys {
			waitStatus(t, b.pool, key, outbox.StatusDelivered)
			require.Len(t, attemptsOf(t, b.pool, key), 1, key)
			require.Equal(t, 1, b.receiver.Effects(key), key)
		}
	}
}
