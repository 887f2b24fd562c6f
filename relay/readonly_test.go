package relay

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// readOnlyPool is a pool on b's database whose sessions take no writes, as those of a
// hot standby or of a primary set default_transaction_read_only do (SQLSTATE 25006).
func readOnlyPool(t *testing.T, b *testBundle) *pgxpool.Pool {
	t.Helper()
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// A relay started on a database that takes no writes (a hot standby, a primary
// demoted, default_transaction_read_only) can claim nothing and record nothing: Run
// fails at once saying so, rather than starting, saying it is ready, and failing every
// claim with a warning for as long as it runs.
func TestRunFailsAtOnceOnAReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r, err := New(readOnlyPool(t, b), cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	// Well inside the relay's wait for a database that is not up (30 s).
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorContains(t, err, "takes no writes")
}

// A running relay whose database stops taking writes (a failover that left it on a
// standby or a demoted primary) says so in Ready, so that /readyz is not "ready" while
// every claim fails; and once writes work again it delivers by itself.
func TestReadyReportsADatabaseThatTakesNoWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	pcfg := b.pool.Config().Copy()
	pcfg.ConnConfig.RuntimeParams["application_name"] = "readonly_test_relay"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var db string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db))
	// setReadOnly sets the database's default and ends the relay's sessions, so the
	// sessions it opens next have the new default, as after a failover.
	setReadOnly := func(on bool) {
		t.Helper()
		stmt := `ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` RESET default_transaction_read_only`
		if on {
			stmt = `ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` SET default_transaction_read_only = on`
		}
		_, err := b.pool.Exec(ctx, stmt)
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'readonly_test_relay'`)
		require.NoError(t, err)
	}

	_, cfg := b.clockedConfig(t)
	r, _ := start(t, pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.Eventually(t, func() bool { return r.Ready(ctx) == nil }, waitTimeout, 5*time.Millisecond)

	setReadOnly(true)
	require.Eventually(t, func() bool {
		err := r.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "takes no writes")
	}, waitTimeout, 5*time.Millisecond)

	setReadOnly(false)
	enqueue(t, b.pool, "after-read-only", "webhook", map[string]int{"n": 1})
	waitStatus(t, b.pool, "after-read-only", outbox.StatusDelivered)
	require.Eventually(t, func() bool { return r.Ready(ctx) == nil }, waitTimeout, 5*time.Millisecond)
}

// A failover that leaves the old primary up but taking no writes, while new sessions
// reach the new primary (a URL with target_session_attrs=read-write, a DNS name or a
// proxy that moved): the pool's sessions on the old server answer pings, so pgxpool
// keeps them, and every claim failed with SQLSTATE 25006 until they reached the pool's
// MaxConnLifetime (an hour by default). The relay must leave them and deliver by itself.
func TestRelayLeavesSessionsThatTakeNoWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	var failedOver atomic.Bool // false: new sessions take no writes, as on the old primary
	var readOnlyNext atomic.Bool
	pcfg := b.pool.Config().Copy()
	pcfg.ConnConfig.RuntimeParams["application_name"] = "readonly_test_failover"
	pcfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if readOnlyNext.Load() && !failedOver.Load() {
			_, err := c.Exec(ctx, `SET default_transaction_read_only = on`)
			return err
		}
		return nil
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	_, cfg := b.clockedConfig(t)
	r, _ := start(t, pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.Eventually(t, func() bool { return r.Ready(ctx) == nil }, waitTimeout, 5*time.Millisecond)

	// The server stops taking writes: the relay's sessions are ended and come back
	// read-only.
	readOnlyNext.Store(true)
	_, err = b.pool.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'readonly_test_failover'`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		err := r.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "takes no writes")
	}, waitTimeout, 5*time.Millisecond)
	// Fill the pool with live read-only sessions, so that it opens no new one unless the
	// relay leaves them: the ended sessions are found out one by one, as they are used.
	held := make([]*pgxpool.Conn, 0, pcfg.MaxConns)
	for len(held) < int(pcfg.MaxConns) {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		var ro string
		if err := c.QueryRow(ctx, `SHOW transaction_read_only`).Scan(&ro); err != nil {
			c.Release() // an ended session: the pool drops it
			continue
		}
		require.Equal(t, "on", ro)
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	enqueue(t, b.pool, "after-failover", "webhook", map[string]int{"n": 1})

	// The new primary takes writes; the sessions on the old one stay up.
	failedOver.Store(true)
	in := waitStatus(t, b.pool, "after-failover", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts)
}

// The same failover, seen by the LISTEN connection: it is made outside the pool, and
// LISTEN still works on the old server, so it stayed there. NOTIFYs from inserts on the
// new primary never reached the relay, which found rows only by polling, while /readyz
// said LISTEN was up. A round refused with 25006 must move it too, and the NOTIFY
// self-test must run again on the new connection.
func TestRelayListensOnTheNewPrimaryAfterAFailover(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	var failedOver atomic.Bool // which server a new session reaches, named in its application_name
	pcfg := b.pool.Config().Copy()
	pcfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.RuntimeParams["application_name"] = "readonly_test_listen_old"
		if failedOver.Load() {
			cc.RuntimeParams["application_name"] = "readonly_test_listen_new"
		}
		return nil
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// listener is the server the relay's LISTEN session is on ("" while there is none).
	listener := func() string {
		var names []string
		rows, err := b.pool.Query(ctx, `SELECT application_name FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN `+notifyChannel+`'
			AND application_name LIKE 'readonly_test_listen_%'`)
		require.NoError(t, err)
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(names, ",")
	}

	_, cfg := b.clockedConfig(t)
	r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	r.probeTimeout = waitTimeout // a busy machine must not make the self-test fail
	run(t, r)
	require.Eventually(t, func() bool { return r.Ready(ctx) == nil }, waitTimeout, 5*time.Millisecond)
	require.Eventually(t, func() bool { return listener() == "readonly_test_listen_old" }, waitTimeout, 5*time.Millisecond)

	// The failover, at once for the relay: every session of its pool is on the old
	// server, which now takes no writes, and new sessions reach the new primary.
	held := takeNoWrites(t, pool)
	failedOver.Store(true)
	enqueue(t, b.pool, "after-failover", "webhook", map[string]int{"n": 1})
	for _, c := range held {
		c.Release()
	}
	waitStatus(t, b.pool, "after-failover", outbox.StatusDelivered)
	require.Positive(t, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim")), "a claim round was refused")

	require.Eventually(t, func() bool { return listener() == "readonly_test_listen_new" }, waitTimeout, 10*time.Millisecond,
		"the LISTEN session is on %q", listener())
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond,
		"the NOTIFY self-test runs again on the new LISTEN session")
}

// While the database takes no writes, every claim round, every reclaim (each poll
// interval) and every pass of the relay's other work fails, and each failure used to be
// a warning: several lines a second, for as long as it lasted, saying nothing new. Each
// kind of failure is now a warning at first and then once a minute, saying how many
// failed since, and a line at info level says when it works again.
func TestRepeatedFailuresAreWarnedAboutOnceAMinute(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	var readOnly atomic.Bool
	pcfg := b.pool.Config().Copy()
	pcfg.ConnConfig.RuntimeParams["application_name"] = "readonly_test_warnings"
	pcfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if readOnly.Load() {
			_, err := c.Exec(ctx, `SET default_transaction_read_only = on`)
			return err
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	setReadOnly := func(on bool) {
		readOnly.Store(on)
		_, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'readonly_test_warnings'`)
		require.NoError(t, err)
	}

	clock, cfg := b.clockedConfig(t)
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r, _ := start(t, pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.Eventually(t, func() bool { return r.Ready(ctx) == nil }, waitTimeout, 5*time.Millisecond)
	lines := func(msg string) []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "msg=\""+msg+"\"") || strings.Contains(l, "failed=\""+msg+"\"") {
				out = append(out, l)
			}
		}
		return out
	}
	failures := func(op string) float64 { return testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues(op)) }
	waitFailures := func(op string, n float64) {
		t.Helper()
		want := failures(op) + n
		require.Eventually(t, func() bool { return failures(op) >= want }, waitTimeout, 5*time.Millisecond, "%s fails %v more times", op, n)
	}

	working := func(msg string) int {
		n := 0
		for _, l := range lines(msg) {
			if strings.Contains(l, "msg=\"working again after failures\"") {
				n++
			}
		}
		return n
	}

	// The sessions ended here fail a statement each before the pool's new ones, which
	// take no writes, are used: count from when those fail.
	setReadOnly(true)
	waitFailures("reclaim", 3)
	waitFailures("claim", 2)
	claims, reclaims := len(lines(claimFailed)), len(lines(reclaimFailed))
	require.Positive(t, claims)
	require.Positive(t, reclaims)
	waitFailures("reclaim", 5)
	waitFailures("claim", 2)
	require.Len(t, lines(reclaimFailed), reclaims, "no more warnings for the reclaims that fail within the minute")
	require.Len(t, lines(claimFailed), claims, "nor for the claim rounds")

	clock.Advance(troubleWarnEvery)
	require.Eventually(t, func() bool { return len(lines(reclaimFailed)) == reclaims+1 }, waitTimeout, 5*time.Millisecond,
		"a minute later, another warning")
	waitFailures("reclaim", 5)
	warned := lines(reclaimFailed)
	require.Len(t, warned, reclaims+1, "and no more within that minute")
	require.Contains(t, warned[reclaims], "failed_since_last_warning=")
	require.Contains(t, warned[reclaims], "failing_for=1m0s")

	before := working(reclaimFailed)
	setReadOnly(false)
	require.Eventually(t, func() bool { return working(reclaimFailed) > before }, waitTimeout, 5*time.Millisecond,
		"says it works again")
	enqueue(t, b.pool, "after", "webhook", map[string]int{"n": 1})
	waitStatus(t, b.pool, "after", outbox.StatusDelivered)
}

// A parking pass behind rows in flight that failed had counted the claims it was for as
// parked behind, so the passes after it, once the relay held no rows of ordering keys
// and claimed none, did not run: the run of failures never ended (no line said the pass
// worked again), and a failure hours later was reported as part of it, failing for
// hours. A pass that failed is run again by the next, as the other passes are.
func TestAFailedPassBehindRowsInFlightRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	_, err := b.pool.Exec(ctx, `
CREATE TABLE test_fail_park (on_ bool);
CREATE FUNCTION test_fail_park() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF starts_with(NEW.last_error, '`+outbox.ParkedPrefix+`') AND EXISTS (SELECT 1 FROM test_fail_park) THEN
        RAISE EXCEPTION 'parking fails';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_fail_park BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION test_fail_park();
INSERT INTO test_fail_park VALUES (true);`)
	require.NoError(t, err)
	clock, cfg := b.clockedConfig(t)
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := b.newRelay(t, cfg)
	msg := "parking rows behind " + inFlightPass.what + " failed; trying again later"
	lines := func(text string) int {
		n := 0
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, text) && strings.Contains(l, msg) {
				n++
			}
		}
		return n
	}

	enqueueOrdered(t, b.pool, "head", "k")
	enqueueOrdered(t, b.pool, "f-1", "k")
	require.Equal(t, 1, claimOnce(t, r))
	head := <-r.instances["webhook"].jobs
	r.parkInFlight(ctx)
	r.parkInFlight(ctx)
	require.Equal(t, 2.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("park")))
	require.Equal(t, 1, lines(`level=WARN`), "warned once")

	// The database works again; the head is delivered, and the row behind it canceled,
	// so the relay holds no rows of ordering keys and claims none.
	_, err = b.pool.Exec(ctx, `DELETE FROM test_fail_park`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = 'canceled' WHERE idempotency_key = 'f-1'`)
	require.NoError(t, err)
	require.Zero(t, deliverInRound(t, r, head))
	r.parkInFlight(ctx)
	require.Equal(t, 1, lines(`msg="working again after failures"`), "the next pass runs, and says it works again")

	// Hours later, a failure starts a run of its own.
	clock.Advance(3 * time.Hour)
	_, err = b.pool.Exec(ctx, `INSERT INTO test_fail_park VALUES (true)`)
	require.NoError(t, err)
	enqueueOrdered(t, b.pool, "head-2", "k2")
	enqueueOrdered(t, b.pool, "g-1", "k2")
	require.Equal(t, 1, claimOnce(t, r))
	r.parkInFlight(ctx)
	require.Equal(t, 2, lines(`level=WARN`))
	require.Zero(t, lines("failed_since_last_warning="), "not part of the run of hours ago")
}

// takeNoWrites holds every session of pool (its MaxConns) and makes each take no
// writes, as a server left behind by a failover does; the caller releases them.
func takeNoWrites(t *testing.T, pool *pgxpool.Pool) []*pgxpool.Conn {
	t.Helper()
	held := make([]*pgxpool.Conn, 0, pool.Config().MaxConns)
	for len(held) < int(pool.Config().MaxConns) {
		c, err := pool.Acquire(t.Context())
		require.NoError(t, err)
		_, err = c.Exec(t.Context(), `SET default_transaction_read_only = on`)
		require.NoError(t, err)
		held = append(held, c)
	}
	return held
}
