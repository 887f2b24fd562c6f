package relay

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A relay stops while the outcome of one row waits for another session's lock (set
// aside by the claim loop), and a delivery is still in flight. The stopping relay's
// recorder wrote the set-aside outcome first, retrying it until the drain time ran out,
// and only then the outcomes of the deliveries that ended during the stop: by then it
// had no time left, and those were never written, though nothing held them up. Their
// rows stayed leased, to come back as ambiguous attempts. Now the locked outcome is set
// aside as the claim loop sets it aside: the others are written as they come, and it is
// written once the lock is let go.
func TestStoppingRelayWritesOtherOutcomesWhileOneWaitsForALock(t *testing.T) {
	t.Parallel()
	slowHook, slow, releaseSlow := newSlowHook(t)
	b := setup(t, receiver.Options{})
	logs := &logBuffer{}
	cfg := b.fastConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	gate := &afterEffectGate{Connector: b.hook, key: "locked", acted: make(chan struct{}), open: make(chan struct{})}
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: gate},
		"webhook:slow": {Connector: slowHook},
	})
	require.NoError(t, err)
	stop, stopped := runSignalled(t, r)

	locked := enqueue(t, b.pool, "locked", "webhook", []int{1})
	waitFor(t, gate.acted, "the row was never sent")
	locker := lockRow(t, b.pool, locked.ID)
	close(gate.open)
	waitForLockWait(t, b.pool, r, locker)
	enqueue(t, b.pool, "in-flight", "webhook:slow", []int{2})
	require.Eventually(t, func() bool { return slow.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond,
		"the slow attempt is in flight")

	stop()
	releaseSlow() // the attempt in flight ends while the relay stops
	waitStatus(t, b.pool, "in-flight", outbox.StatusDelivered)
	in, err := outbox.Get(t.Context(), b.pool, "locked")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "its outcome waits for the lock")

	require.NoError(t, locker.Rollback(t.Context()))
	stopped()
	for _, key := range []string{"locked", "in-flight"} {
		in, err := outbox.Get(t.Context(), b.pool, key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, in.Status, key)
		got := attemptsOf(t, b.pool, key)
		require.Len(t, got, 1, "%s: %+v", key, got)
		require.Equal(t, statusDelivered, got[0].Outcome, key)
	}
	require.NotContains(t, logs.String(), "could not record every outcome")
}

// Another session holds a lock on the outbox table, not on a row (a migration's CREATE
// INDEX holds SHARE while it scans the table; LOCK TABLE), for longer than a write of
// outcomes waits for a lock. The write fails with the same SQLSTATE as for a row's lock,
// but the look finds no row locked: writeAround then split the batch in halves, down to
// single outcomes, a lock wait for each write (2n-1 for n outcomes, the claim loop
// standing still meanwhile), and set each single outcome aside with a warning that
// another session keeps a lock on its row, counted as such. Now a lock the look does not
// see is not taken for a row's: the batch is left, with the error, for the caller to
// retry as after any failure, and no outcome is set aside or named. The outcomes are
// written again as after a lost reply (lockAgainSQL first), where the table's lock is
// met after the lock wait is set.
func TestTableLockIsNotTakenForARowLock(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	logs := &logBuffer{}
	clock, cfg := b.clockedConfig(t)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	// In the exec mode: in pgx's default mode a statement new to the connection is
	// prepared first, in a transaction of its own, where the table's lock is met before
	// the lock wait is set.
	r, err := New(pgtest.InMode(t, b.pool, pgx.QueryExecModeExec), cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	var outs []outcome
	for i := range 4 {
		o := claimedOutcome(t, r, b.pool, clock, fmt.Sprintf("row-%d", i))
		o.maybeWritten = true
		outs = append(outs, o)
	}
	locker, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(context.WithoutCancel(t.Context())) })
	_, err = locker.Exec(t.Context(), `LOCK TABLE outbox IN SHARE MODE`)
	require.NoError(t, err)

	left, blocked, err := r.writeAround(t.Context(), outs)
	require.True(t, lockTimedOut(err), "%v", err)
	require.Empty(t, blocked, "taken for a row's lock")
	require.Len(t, left, len(outs))
	require.NotContains(t, logs.String(), "another database session holds a lock on this row")
	require.Zero(t, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("record")))

	require.NoError(t, locker.Rollback(t.Context()))
	left, blocked, err = r.writeAround(t.Context(), left)
	require.NoError(t, err)
	require.Empty(t, left)
	require.Empty(t, blocked)
	for i := range outs {
		key := fmt.Sprintf("row-%d", i)
		in, err := outbox.Get(t.Context(), b.pool, key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, in.Status, key)
		require.Len(t, attemptsOf(t, b.pool, key), 1, key)
	}
}

// A write of outcomes sends one statement (recordSQL), as before it waited at most a
// second for a row's lock: the lock wait rides on recordSQL itself (recordLockWaitGate),
// not on a statement of its own in every round. And a lock on the table (a migration's
// CREATE INDEX, LOCK TABLE), which holds up every outcome and every claim alike and which
// no look at rows can pin on one outcome, is waited for, as the claims wait for it, not
// cut at a second, in every query exec mode: the write is still waiting well past
// recordLockWait by the database's clock, and goes through once the lock is let go.
func TestRecordLockWaitRidesOnTheWrite(t *testing.T) {
	t.Parallel()
	o := outcome{id: 1, attempt: 1, status: statusDelivered, record: statusDelivered}
	r := &Relay{cfg: &Config{ID: "r"}}
	b := &pgx.Batch{}
	require.Equal(t, 1, queueRecord(b, []outcome{o}, r.recordArgs([]outcome{o}), nil))
	require.Equal(t, 1, b.Len(), "statements a write of outcomes sends")

	for _, mode := range append([]pgx.QueryExecMode{pgx.QueryExecModeCacheStatement}, pgtest.ExecModes...) {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			clock, cfg := b.clockedConfig(t)
			r, err := New(pgtest.InMode(t, b.pool, mode), cfg, map[string]Instance{"webhook": {Connector: b.hook}})
			require.NoError(t, err)
			o := claimedOutcome(t, r, b.pool, clock, "table-locked")
			locker, err := b.pool.Begin(t.Context())
			require.NoError(t, err)
			t.Cleanup(func() { _ = locker.Rollback(context.WithoutCancel(t.Context())) })
			_, err = locker.Exec(t.Context(), `LOCK TABLE outbox IN SHARE MODE`)
			require.NoError(t, err)

			written := make(chan error, 1)
			go func() { written <- r.execRecord(t.Context(), []outcome{o}, r.recordArgs([]outcome{o})) }()
			require.Eventually(t, func() bool {
				var waited bool
				err := b.pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
					WHERE $1::int = ANY (pg_blocking_pids(pid)) AND clock_timestamp() - state_change > $2::interval)`,
					locker.Conn().PgConn().PID(), 3*recordLockWait).Scan(&waited)
				return err == nil && waited
			}, waitTimeout, 10*time.Millisecond, "the write did not wait for the table's lock")
			require.NoError(t, locker.Rollback(t.Context()))
			require.NoError(t, <-written)
			in, err := outbox.Get(t.Context(), b.pool, "table-locked")
			require.NoError(t, err)
			require.Equal(t, outbox.StatusDelivered, in.Status)
		})
	}
}

// A relay stops while another session keeps locked a row it claimed and did not start,
// and the lock outlasts the stop. The stopping relay keeps looking at the row until its
// drain time runs out, as it may (the lock may go, and the row then goes back never
// attempted); but every outcome was recorded long before, and it then said it "could
// not record every outcome before exit", an error that sends an operator looking for
// outcomes that were not lost. It now says only what is left: the row, leased to it.
func TestStopWithALockedHandBackLeftSaysWhatIsLeft(t *testing.T) {
	t.Parallel()
	slowHook, slow, releaseSlow := newSlowHook(t)
	b := setup(t, receiver.Options{})
	logs := &logBuffer{}
	cfg := b.fastConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.Concurrency = 1
	cfg.ShutdownTimeout = minRecordDrain
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
	releaseSlow()
	stopped()
	waitStatus(t, b.pool, "slow", outbox.StatusDelivered)
	require.Contains(t, logs.String(), "stopped while another database session kept locked rows this relay claimed")
	require.NotContains(t, logs.String(), "could not record every outcome")
	require.NotContains(t, logs.String(), "outcomes not recorded")
}

// The write of an outcome waits for a row's lock another session keeps, and its
// connection breaks meanwhile (a partition: the cancel is lost too), so the relay cannot
// know whether it committed. The write again ends the lost write's session first, then
// meets the lock itself, and sets the outcome aside, still marked as perhaps written;
// the relay's other rows go on; once the lock is let go the outcome is written once:
// one attempt logged, one effect.
func TestLostReplyOfAWriteWaitingForARowLock(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	gate := &afterEffectGate{Connector: newHook(t, rcv.URL()), key: "locked", acted: make(chan struct{}), open: make(chan struct{})}
	r, _ := start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: gate}})

	locked := enqueue(t, direct, "locked", "webhook", []int{1})
	waitFor(t, gate.acted, "the row was never sent")
	locker := lockRow(t, direct, locked.ID)
	close(gate.open)
	require.Eventually(t, func() bool { return waitsFor(t, direct, locker) }, waitTimeout, 5*time.Millisecond,
		"the write never met the lock")
	proxy.partition()
	proxy.restore()
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("record")) == 1 },
		waitTimeout, 5*time.Millisecond, "the outcome was never set aside")

	enqueue(t, direct, "free", "webhook", []int{2})
	waitStatus(t, direct, "free", outbox.StatusDelivered)
	in, err := outbox.Get(t.Context(), direct, "locked")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "its outcome waits for the lock")
	require.Empty(t, attemptsOf(t, direct, "locked"))

	require.NoError(t, locker.Rollback(t.Context()))
	waitStatus(t, direct, "locked", outbox.StatusDelivered)
	got := attemptsOf(t, direct, "locked")
	require.Len(t, got, 1, "%+v", got)
	require.Equal(t, statusDelivered, got[0].Outcome)
	require.Equal(t, 1, rcv.Effects("locked"))
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("record")), "said once")
}

// The lock wait a write of outcomes sets is local to its transaction, in every query
// exec mode, on each path that sets it: a round of outcomes and claims that fails on a
// row's lock (rolled back), and the look at which rows are locked (committed). No
// session of the pool, which an application embedding the relay may share, keeps it.
func TestLockWaitNeverOutlivesItsTransaction(t *testing.T) {
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
			enqueue(t, b.pool, "other", "webhook", []int{2})
			var before string
			require.NoError(t, pool.QueryRow(t.Context(), `SHOW lock_timeout`).Scan(&before))
			locker := lockRow(t, b.pool, o.id)

			_, err = r.claimAndRecord(t.Context(), []claimPlan{{inst: r.instances["webhook"], limit: 10, bytes: 1 << 20}}, []outcome{o})
			require.True(t, lockTimedOut(err), "%v", err)
			locked, err := r.lockedOutcomes(t.Context(), []outcome{o})
			require.NoError(t, err)
			require.Equal(t, map[int64]int64{o.id: o.id}, locked)
			for _, conn := range pool.AcquireAllIdle(t.Context()) {
				var setting string
				require.NoError(t, conn.QueryRow(t.Context(), `SHOW lock_timeout`).Scan(&setting))
				conn.Release()
				require.Equal(t, before, setting, "the lock wait outlived its transaction")
			}
			require.NoError(t, locker.Rollback(t.Context()))
		})
	}
}
