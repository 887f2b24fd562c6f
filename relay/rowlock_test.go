package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	requireDeliveredOnce(t, b, "locked", logs, "another database session holds a lock on this row")
}

// The same with a lock on the next row of an ordering key: the write of the outcome of
// the key's row in flight, which makes the next row due (lockNextSQL), waits for it. It
// holds up that key only, and only its next row: the outcome is written without letting
// the next row go, which goes once the lock is let go.
func TestNextRowLockedByAnotherSessionHoldsUpOnlyItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	enqueueOrdered(t, b.pool, "head", "order-7")
	next := enqueueOrdered(t, b.pool, "next", "order-7")
	locker := lockRow(t, b.pool, next.ID)
	r, _ := start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	waitForLockWait(t, b.pool, r, locker)

	requireOthersGoOn(t, b, "unordered")
	// The head's own row is free: its outcome is written without letting the next row go
	// (withheld, its lease ran out and another relay would send it again).
	waitStatus(t, b.pool, "head", outbox.StatusDelivered)
	in, err := outbox.Get(t.Context(), b.pool, "next")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status, "next")
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

// Another session locks a row the relay claimed but did not start, and keeps the lock:
// here a row that waited too long for the one delivery slot, which the relay hands back.
// The hand-back waited for the lock its ten seconds, and, failed, was tried again before
// every round, which waited as long again each time, so that the relay claimed and wrote
// outcomes once every ten seconds for as long as the lock was kept. Now the hand-back
// skips the locked row and sets it aside: the relay's other rows go on, no session of
// the relay waits for the lock, and once the lock is let go the row is handed back, its
// unstarted attempt uncounted, and then delivered once, with no ambiguous attempt.
func TestRowHandedBackWhileLockedHoldsUpOnlyItsHandBack(t *testing.T) {
	t.Parallel()
	slowHook, slow, releaseSlow := newSlowHook(t)
	b := setup(t, receiver.Options{})
	logs := &logBuffer{}
	clock, cfg := b.clockedConfig(t)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.Concurrency = 1
	cfg.Lease = 6 * time.Second // the webhook hook's 5s limit leaves a row 500ms to start
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook},
	})
	waitBehindSlowAttempt(t, b, slow, "locked")
	in, err := outbox.Get(t.Context(), b.pool, "locked")
	require.NoError(t, err)
	locker := lockRow(t, b.pool, in.ID)
	clock.Advance(time.Second) // past the row's 500ms to start: its worker hands it back
	// A hand-back that waited for the lock would wait its whole 10 s before it could be
	// counted, so a look at every turn until the row is set aside sees it, rather than
	// a look at one moment after.
	var waited atomic.Bool
	require.Eventually(t, func() bool {
		if waitsFor(t, b.pool, locker) {
			waited.Store(true)
		}
		return waited.Load() || testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("release")) > 0
	}, waitTimeout, 5*time.Millisecond, "the hand-back never met the lock")
	require.False(t, waited.Load(), "a session of the relay waits for the lock")
	releaseSlow()

	requireOthersGoOn(t, b, "free")
	require.False(t, waitsFor(t, b.pool, locker), "a session of the relay waits for the lock")
	in, err = outbox.Get(t.Context(), b.pool, "locked")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "its hand-back waits for the lock")
	require.Empty(t, attemptsOf(t, b.pool, "locked"))
	require.Zero(t, b.receiver.Effects("locked"))
	require.Contains(t, logs.String(), fmt.Sprintf("id=%d key=locked", in.ID), "the warning names the row")
	require.Contains(t, logs.String(), "another database session holds a lock on a row this relay claimed but did not start")
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("release")), "counted once")

	require.NoError(t, locker.Rollback(t.Context()))
	in = requireDeliveredOnce(t, b, "locked", logs, "another database session holds a lock on a row this relay claimed")
	require.Equal(t, 1, in.Attempts, "the attempt handed back was not counted")
}

// The rows of a round whose reply was lost are handed back by their round's lease
// (releaseLostSQL); one of them another session keeps locked. The hand-back waited for
// the lock, failed at its ten seconds, and handed back none of them, not even the rows
// free. Now it hands back those free at once and sets the locked one aside; while it is
// set aside, its lease running out makes no ambiguous attempt of it in this relay's
// reclaim, and once the lock is let go it is handed back, never attempted.
func TestLostRoundRowLockedByAnotherSessionIsHandedBackOnceLetGo(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	enqueue(t, b.pool, "locked", "webhook", []int{1})
	enqueue(t, b.pool, "free", "webhook", []int{2})
	rows := claimRows(t, r, "webhook")
	require.Len(t, rows, 2)
	locked := rows[slices.IndexFunc(rows, func(c claimed) bool { return c.key == "locked" })]
	locker := lockRow(t, b.pool, locked.id)

	// As roundLost notes a round whose reply was lost; releaseAgain runs before the
	// claim loop's next round.
	r.lost = []time.Time{locked.lease}
	r.anyUnreleased.Store(true)
	r.releaseAgain(t.Context())
	require.False(t, r.anyUnreleased.Load(), "the hand-back failed")
	for key, status := range map[string]string{"free": outbox.StatusPending, "locked": outbox.StatusDelivering} {
		in, err := outbox.Get(t.Context(), b.pool, key)
		require.NoError(t, err)
		require.Equal(t, status, in.Status, key)
	}

	// The lease runs out and the lock is let go before the next look: this relay's
	// reclaim leaves the row to the hand-back.
	clock.Advance(r.cfg.Lease + time.Second)
	require.NoError(t, locker.Rollback(t.Context()))
	r.bounded(t.Context(), r.reclaim)
	require.Empty(t, attemptsOf(t, b.pool, "locked"), "reclaimed as an attempt abandoned")

	require.Eventually(t, func() bool {
		r.releaseAgain(t.Context()) // before a round; it looks again once its backoff allows
		in, err := outbox.Get(t.Context(), b.pool, "locked")
		return err == nil && in.Status == outbox.StatusPending
	}, waitTimeout, 10*time.Millisecond, "the row was never handed back")
	in, err := outbox.Get(t.Context(), b.pool, "locked")
	require.NoError(t, err)
	require.Zero(t, in.Attempts, "the attempt handed back was not counted")
	require.Empty(t, attemptsOf(t, b.pool, "locked"))
	var ambiguous bool
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT ambiguous FROM outbox WHERE id = $1`, locked.id).Scan(&ambiguous))
	require.False(t, ambiguous)
	require.Zero(t, b.receiver.Effects("locked"))
}

// A relay that stops hands back the rows it claimed and will not start; one of them
// another session keeps locked. The stopping relay sets it aside and keeps looking, as
// it retries a release that failed, rather than leaving it to its lease (and so to a
// reclaim that would take it for an abandoned, ambiguous attempt): once the lock is let
// go, it is handed back, never attempted, and the relay's stop ends.
func TestRowLockedWhileAStoppingRelayHandsItBackIsHandedBackOnceLetGo(t *testing.T) {
	t.Parallel()
	slowHook, slow, releaseSlow := newSlowHook(t)
	b := setup(t, receiver.Options{})
	cfg := b.fastConfig()
	cfg.Concurrency = 1
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook},
	})
	require.NoError(t, err)
	stop, stopped := runSignalled(t, r)
	waitBehindSlowAttempt(t, b, slow, "locked")
	in, err := outbox.Get(t.Context(), b.pool, "locked")
	require.NoError(t, err)
	locker := lockRow(t, b.pool, in.ID)

	stop()
	waitForLockWaitOf(t, b.pool, r, locker, "release")
	releaseSlow() // the attempt in flight ends: only the hand-back is left
	require.NoError(t, locker.Rollback(t.Context()))
	stopped()

	in, err = outbox.Get(t.Context(), b.pool, "locked")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
	require.Zero(t, in.Attempts, "the attempt handed back was not counted")
	require.Empty(t, attemptsOf(t, b.pool, "locked"))
	require.Zero(t, b.receiver.Effects("locked"))
}

// A row in flight whose relay died goes dead by reclaim on its last attempt, which lets
// its key's next row go (lockNextSQL); another session keeps that next row locked. The
// reclaim waited for the lock until its time limit cut it short, was rolled back, and so
// was every pass after it: no expired lease, of any row, was put back for as long as the
// lock was kept, and each pass held the relay's periodic work up as long. Now the
// reclaim waits at most recordLockWait for that lock, and then puts the rows back
// without letting their keys' next rows go (a row parked behind goes when its parking
// ends, as it would have with its relay alive).
func TestNextRowLockedByAnotherSessionHoldsUpNoReclaim(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	logs := &logBuffer{}
	clock, cfg := b.clockedConfig(t)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.MaxAttempts = 1
	r := b.newRelay(t, cfg)
	// Cut short well before the test's own wait, so that a reclaim that waits for the
	// lock fails the test rather than hang it.
	r.maintainTimeout = waitTimeout / 4
	enqueueOrdered(t, b.pool, "head", "order-7")
	next := enqueueOrdered(t, b.pool, "next", "order-7")
	enqueue(t, b.pool, "other", "webhook", []int{1})
	require.Equal(t, 2, claimOnce(t, r), "the head and the other row; the next waits for the head")
	for range 2 {
		<-r.instances["webhook"].jobs // no worker takes them: the relay is as good as gone
	}
	locker := lockRow(t, b.pool, next.ID)

	clock.Advance(r.cfg.Lease + time.Second) // the relay that held them is gone
	r.bounded(t.Context(), r.reclaim)
	for _, key := range []string{"head", "other"} {
		in, err := outbox.Get(t.Context(), b.pool, key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDead, in.Status, "%s: put back on its last attempt", key)
		got := attemptsOf(t, b.pool, key)
		require.Len(t, got, 1, "%s: %+v", key, got)
		require.Equal(t, "lease_expired", got[0].Outcome, key)
	}
	require.Contains(t, logs.String(), "another database session keeps locked the next row of an ordering key")

	require.NoError(t, locker.Rollback(t.Context()))
	require.Equal(t, 1, claimOnce(t, r), "the next row, its head dead")
	require.Equal(t, "next", (<-r.instances["webhook"].jobs).key)
}

// requireDeliveredOnce waits until key's row, whose write waited for another session's
// lock, is delivered, and requires one attempt logged, delivered and not ambiguous, one
// effect at the receiver, and warning said once in logs, not at every look.
func requireDeliveredOnce(t *testing.T, b *testBundle, key string, logs *logBuffer, warning string) outbox.Intent {
	t.Helper()
	in := waitStatus(t, b.pool, key, outbox.StatusDelivered)
	got := attemptsOf(t, b.pool, key)
	require.Len(t, got, 1, "%+v", got)
	require.Equal(t, statusDelivered, got[0].Outcome)
	require.False(t, got[0].Ambiguous)
	require.Equal(t, 1, b.receiver.Effects(key))
	require.Equal(t, 1, strings.Count(logs.String(), warning), "said once, not at every look")
	return in
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
	waitForLockWaitOf(t, pool, r, locker, "record")
}

// waitForLockWaitOf waits until a write of r counted under op (in
// outboxd_database_errors_total) has met the lock that locker holds: a session of r's
// waits for locker, or r has said it set the write aside.
func waitForLockWaitOf(t *testing.T, pool *pgxpool.Pool, r *Relay, locker pgx.Tx, op string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return waitsFor(t, pool, locker) || testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues(op)) > 0
	}, waitTimeout, 5*time.Millisecond, "the %s never met the lock", op)
}

// waitsFor reports whether a session waits for a lock that locker holds.
func waitsFor(t *testing.T, pool *pgxpool.Pool, locker pgx.Tx) bool {
	t.Helper()
	var waiting bool
	err := pool.QueryRow(t.Context(),
		`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`,
		locker.Conn().PgConn().PID()).Scan(&waiting)
	return err == nil && waiting
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
