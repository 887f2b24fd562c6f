package relay

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/outbox"
)

// The database is away for a moment when the relay is told to stop. Its release of the
// rows it claimed ahead and will not start fails; it was never tried again, although the
// relay goes on for a while (the attempt in flight finishes, its outcome is written once
// the database is back), so the row never sent stayed leased until the lease expired,
// to come back as an ambiguous attempt (held for an operator with the hold policy, dead
// when it was the last attempt), its attempt counted.
func TestFailedReleaseAtStopIsRetriedWhileStopping(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	released := make(chan struct{})
	cfg.Logger = slog.New(signalHandler{want: "could not release unstarted rows", once: &sync.Once{}, seen: released})
	cfg.Concurrency = 1 // one worker: the second row is claimed ahead and waits for it
	conn := newGatedConnector()
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	cancel, stopped := runSignalled(t, r)

	first, second := deliverOneOfTwo(t, direct, r, conn)

	proxy.cut() // PostgreSQL restarts, say
	cancel()    // SIGTERM
	waitFor(t, released, "the release of the row not started never failed")
	proxy.restore() // PostgreSQL is back; the relay is still stopping
	close(conn.gate)
	stopped()

	in, err := outbox.Get(t.Context(), direct, first)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status, "the attempt in flight finished and its outcome was written")
	in, err = outbox.Get(t.Context(), direct, second)
	require.NoError(t, err)
	t.Logf("row not started: status=%s attempts=%d", in.Status, in.Attempts)
	require.Equal(t, outbox.StatusPending, in.Status, "the row never started is handed back once the database answers")
	require.Zero(t, in.Attempts)
}

// As TestFailedHandBackIsReleasedWhenTheDatabaseReturns, but the database stays away
// for longer than the lease. When it returns, this relay's own reclaim (every poll
// interval) found the lease of the row it handed back, and which it knows it never sent,
// expired, and put it back as an abandoned ambiguous attempt before the claim loop
// (asleep in its backoff) retried the release: a phantom attempt was counted and logged
// as lease_expired, the row's next attempt was told the previous one was ambiguous, and
// a hold-policy connector's row would wait for an operator. Reclaim now retries the
// release first, and waits while it fails.
func TestOwnReclaimDoesNotTakeARowWhoseReleaseFailed(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	released := make(chan struct{})
	cfg.Logger = slog.New(signalHandler{want: "could not release unstarted rows", once: &sync.Once{}, seen: released})
	cfg.Concurrency = 1
	conn := newGatedConnector()
	r, _ := start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})

	first, second := deliverOneOfTwo(t, direct, r, conn)

	proxy.cut()
	clock.Advance(r.cfg.Lease + time.Second) // the outage outlasts the lease
	failed := testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim"))
	close(conn.gate)
	waitFor(t, released, "the handed-back row's release never failed")
	// A long outage: the claim loop's backoff has grown (to seconds), while reclaim runs
	// every poll interval.
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim")) >= failed+6 },
		waitTimeout, time.Millisecond, "rounds fail while the database is away")
	proxy.restore()

	waitStatus(t, direct, first, outbox.StatusDelivered)
	in := waitStatus(t, direct, second, outbox.StatusDelivered)
	att := attemptsOf(t, direct, second)
	got := conn.deliveries(second)
	t.Logf("never-sent row %s: attempts=%d log=%+v deliveries=%d previousAmbiguous=%v", second, in.Attempts, att, len(got), got[len(got)-1].PreviousAmbiguous)
	require.Equal(t, 1, in.Attempts, "the attempt that never started is not counted")
	require.Len(t, att, 1, "no phantom lease_expired attempt")
	require.False(t, got[0].PreviousAmbiguous)
}

// cancelledConnector holds the delivery of key until its context ends, and reports that.
type cancelledConnector struct {
	recordingConnector
	gateKey   string // held until gate closes, then succeeds
	gate      chan struct{}
	key       string
	started   chan struct{}
	cancelled chan struct{}
}

func (c *cancelledConnector) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	if d.Key == c.gateKey {
		<-c.gate
	}
	if d.Key != c.key {
		return c.recordingConnector.Deliver(ctx, d)
	}
	close(c.started)
	<-ctx.Done()
	close(c.cancelled)
	return nil, ctx.Err()
}

// The relay is told to stop while a round is stuck in the database (its outcome write
// waits for a row lock; a hung connection does the same). Deliveries in flight are to
// end within ShutdownTimeout of the stop. The shutdown timer started only once the claim
// loop had returned, and the loop waits for the round, up to roundTimeout (30s), so the
// attempt in flight was cancelled only after the stuck round gave up: ~30s after the
// stop instead of 50ms. The timer now runs from the stop.
func TestShutdownTimeoutRunsFromTheStopWhileARoundIsStuck(t *testing.T) {
	t.Parallel()
	dsn, pool := childDB(t)
	relayPool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)
	cfg := &Config{PollInterval: 50 * time.Millisecond, ShutdownTimeout: 50 * time.Millisecond, Registerer: prometheus.NewRegistry(),
		Logger: testLogger()}
	conn := &cancelledConnector{key: "slow", started: make(chan struct{}), cancelled: make(chan struct{}), gateKey: "a", gate: make(chan struct{})}
	r, err := New(relayPool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	cancel, stopped := runSignalled(t, r)

	enqueue(t, pool, "slow", "webhook", []int{1})
	waitFor(t, conn.started, "the slow row never started")
	// Row a's outcome (ordered: written at once) waits for a lock someone holds on a.
	lockTx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = lockTx.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = outbox.Enqueue(t.Context(), pool, outbox.Message{Key: "a", Connector: "webhook", Payload: []int{1}, OrderingKey: "k"})
	require.NoError(t, err)
	waitStatus(t, pool, "a", outbox.StatusDelivering)
	_, err = lockTx.Exec(t.Context(), `SELECT 1 FROM outbox WHERE idempotency_key = 'a' FOR UPDATE`)
	require.NoError(t, err)
	close(conn.gate)
	waiting := func() bool {
		var n int
		err := pool.QueryRow(context.WithoutCancel(t.Context()), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%AS t(id, attempt, status%'`).Scan(&n)
		return err != nil || n >= 1
	}
	require.Eventually(t, waiting, waitTimeout, 5*time.Millisecond, "a's outcome round waits for the lock")

	// The claim loop, once it returns, withdraws the relay's words in
	// outbox_wake_connectors: while they stand, the loop is still stuck in the round.
	loopRunning := func() bool {
		var n int
		err := pool.QueryRow(context.WithoutCancel(t.Context()), `SELECT count(*) FROM outbox_wake_connectors WHERE relay_id = $1`, r.ID()).Scan(&n)
		require.NoError(t, err)
		return n > 0
	}
	require.Eventually(t, loopRunning, waitTimeout, 5*time.Millisecond)

	cancel() // SIGTERM
	stoppedAt := time.Now()
	waitFor(t, conn.cancelled, "the attempt in flight was never cancelled")
	t.Logf("the attempt in flight was cancelled %s after the stop (ShutdownTimeout %s)", time.Since(stoppedAt).Round(time.Millisecond), cfg.ShutdownTimeout)
	require.True(t, loopRunning() && waiting(), "the attempt in flight was cancelled only once the stuck round gave up (roundTimeout after the stop), "+
		"not at the shutdown timeout while the round was still stuck")
	require.NoError(t, lockTx.Rollback(t.Context()))
	stopped()
}

// A round's claim commits, its reply is lost, and the database then stays away for
// longer than the lease. When it returns, this relay's own reclaim (every poll
// interval) must not put back the row that round claimed, which this relay knows it
// never sent, as an abandoned ambiguous attempt before the claim loop (asleep in its
// backoff) hands it back.
func TestOwnReclaimDoesNotTakeARowOfALostRound(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	conn := &recordingConnector{}
	proxy.cutOnKill = true
	proxy.arm("SET status = 'delivering'", []byte("lost-claim"))
	r, _ := start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	failed := testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim"))

	enqueue(t, direct, "lost-claim", "webhook", map[string]int{"n": 1})
	waitKilled(t, proxy)
	in, err := outbox.Get(t.Context(), direct, "lost-claim")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "the claim committed")
	clock.Advance(r.cfg.Lease + time.Second) // the outage outlasts the lease
	// A long outage: the claim loop's backoff has grown (to seconds), while reclaim runs
	// every poll interval.
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim")) >= failed+6 },
		waitTimeout, time.Millisecond, "rounds fail while the database is away")
	proxy.restore()

	in = waitStatus(t, direct, "lost-claim", outbox.StatusDelivered)
	att := attemptsOf(t, direct, "lost-claim")
	got := conn.deliveries("lost-claim")
	require.Equal(t, 1, in.Attempts, "the claim that was never started is not counted: %+v", att)
	require.Len(t, att, 1, "no phantom lease_expired attempt")
	require.Len(t, got, 1)
	require.False(t, got[0].PreviousAmbiguous)
}

// Reclaim's statement gets no answer (the connection hangs: packets dropped without a
// reset, for as long as the kernel retransmits), and then a round's reply is lost, so
// the claim loop has rows to hand back before its next round. It waited for the
// reclaim pass, which held releasingMu across its statement, and wrote no outcome and
// claimed no row until that statement ended. The claim loop must go on.
func TestHungReclaimDoesNotStopTheClaimLoop(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	conn := &recordingConnector{}
	held, _ := proxy.holdOnce(t, "lost its lease during attempt") // reclaimSQL
	// Armed before the claim is first prepared; it loses only the reply holding the row.
	proxy.arm("SET status = 'delivering'", []byte("lost-claim"))
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	// The hung reclaim is not cut short while the test waits: cut short (maintainTimeout,
	// 30s, within waitTimeout), it let the claim loop go on all the same, and a reclaim
	// holding releasingMu across its statements again went unseen.
	r.maintainTimeout = 2 * waitTimeout
	run(t, r)
	waitFor(t, held, "reclaim never ran")

	lostClaimThenAfter(t, direct, proxy)
}

// A reclaim whose connection hangs (its request never reaches the database, and no reset
// comes) is cut short after maintainTimeout, and the next reclaim, on another connection,
// puts back the row a relay that died left in flight. It used to wait on the hung
// connection for as long as the kernel retransmitted (here: until the test ended), and
// that row with it.
func TestHungReclaimIsCutShortAndTheNextPutsRowsBack(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	enqueue(t, direct, "orphan", "webhook", map[string]int{"n": 1})
	_, err := direct.Exec(t.Context(), `UPDATE outbox SET status = 'delivering', attempts = 1, lease_owner = 'ghost',
		lease_expires_at = now() - interval '1 second'`) // the relay's clock is a minute ahead
	require.NoError(t, err)
	held, _ := proxy.holdOnce(t, "lost its lease during attempt") // reclaimSQL
	conn := &recordingConnector{}
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	r.maintainTimeout = time.Second
	run(t, r)
	waitFor(t, held, "reclaim never ran")

	in := waitStatus(t, direct, "orphan", outbox.StatusDelivered)
	require.Equal(t, 2, in.Attempts)
	got := attemptsOf(t, direct, "orphan")
	require.Len(t, got, 2)
	require.Equal(t, []string{"lease_expired", "delivered"}, []string{got[0].Outcome, got[1].Outcome})
	require.True(t, got[0].Ambiguous, "the attempt of the relay that died is ambiguous")
	require.GreaterOrEqual(t, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("reclaim")), 1.0,
		"the reclaim cut short is reported as a failure, not taken for the relay stopping")
}

// A stopping relay retries the hand-backs that failed (the database was away at the
// stop) until none is left (releaseWhileStopping). Reclaim, which runs on until the
// recorder is done, retries them too, and takes them off the lists while its hand-back
// runs. releaseWhileStopping, finding the lists empty then, returned: Run went on to stop
// the background work, which cut reclaim's hand-back short (or it failed by itself),
// the rows went back on the lists, and nothing tried again. The row, never sent, stayed
// leased, to come back as an ambiguous attempt once its lease expired (held for an
// operator under the hold policy, dead on its last attempt).
func TestStoppingRelayWaitsForAHandBackUnderWay(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	// Cuts short the held hand-back below, as a slow database or a lost connection
	// would: it fails, and its rows go back on the lists.
	r.maintainTimeout = time.Second
	enqueue(t, direct, "never-sent", "webhook", map[string]int{"n": 1})
	got, err := r.claimAndRecord(t.Context(), []claimPlan{{inst: r.instances["webhook"], limit: 1, bytes: 1 << 20}}, nil)
	require.NoError(t, err)
	require.Len(t, got[0], 1)

	// The stop's hand-back of the row claimed and not started fails: the database is away.
	proxy.cut()
	r.release(context.Background(), got[0])
	proxy.restore()
	require.True(t, r.anyUnreleased.Load())

	// Reclaim's pass retries it; its statement is under way (held by the proxy).
	held, release := proxy.holdOnce(t, "AS r(id, attempt, lease)")
	bgCtx, stopBackground := context.WithCancel(t.Context())
	defer stopBackground()
	reclaimed := make(chan struct{})
	go func() { defer close(reclaimed); r.bounded(bgCtx, r.reclaim) }()
	waitFor(t, held, "reclaim never retried the hand-back")

	// The workers are done, and the relay retries its failed hand-backs, as Run does.
	done := make(chan struct{})
	close(done)
	recordCtx, cancelRecords := context.WithTimeout(t.Context(), waitTimeout)
	defer cancelRecords()
	r.releaseWhileStopping(recordCtx, done)
	stopBackground() // Run stops the background work once the recorder is done
	<-reclaimed

	in, err := outbox.Get(t.Context(), direct, "never-sent")
	require.NoError(t, err)
	release()
	require.Equal(t, outbox.StatusPending, in.Status, "the row never sent is handed back while the relay stops (unreleased: %v)", r.anyUnreleased.Load())
	require.Zero(t, in.Attempts)
}
