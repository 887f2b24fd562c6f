package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// An outcome's write is still running in the database (waiting at its commit for a lock)
// when the network breaks, so the relay writes it again with recordAgainSQL once the
// database answers. The second write waits for the first's row lock; the first then
// commits. recordAgainSQL's check for an attempt already logged ran before that commit,
// so the attempt was logged twice. The relay now ends the first write's session before it
// writes again (see fence); lockAgainSQL still covers a pooler's sessions, which it
// cannot end.
func TestOutcomeWrittenAgainWhileTheFirstWriteRunsIsLoggedOnce(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	ctx := t.Context()
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	unlock, waiting := blockAtCommit(t, direct, "twice", "delivered")

	o := claimedOutcome(t, r, direct, clock, "twice")

	done := make(chan struct{})
	go func() { defer close(done); r.writeOutcomes(ctx, []outcome{o}) }()
	require.Eventually(t, func() bool { return waiting("advisory") == 1 }, waitTimeout, 10*time.Millisecond, "the first write waits at its commit")
	first := waitingPID(t, direct, "advisory")
	proxy.partition() // the relay writes it again once the database answers
	proxy.restore()
	require.Eventually(t, func() bool {
		return sessionGone(t, direct, first) && waiting("advisory") == 1
	}, waitTimeout, 10*time.Millisecond, "the first write's session is ended, and the second write waits at its commit")
	unlock()
	<-done

	in, err := outbox.Get(ctx, direct, "twice")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status)
	att := attemptsOf(t, direct, "twice")
	require.Len(t, att, 1, "attempts log: %+v", att)
}

// blockAtCommit holds every transaction that writes status to the row of key at its
// commit until unlock is called (a deferred constraint trigger waits for an advisory lock
// the test holds); waiting counts the sessions waiting for event (advisory: held there).
func blockAtCommit(t *testing.T, pool *pgxpool.Pool, key, status string) (unlock func(), waiting func(event string) int) {
	t.Helper()
	return holdAtLock(t, pool, fmt.Sprintf(`
CREATE FUNCTION test_block_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.idempotency_key = '%s' AND NEW.status = '%s' THEN
        PERFORM pg_advisory_xact_lock_shared(4343);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_block_commit AFTER UPDATE ON outbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_block_commit();`, key, status))
}

// blockAtUpdate holds every update of the row of key for which when (SQL on NEW) holds,
// as it writes it, until unlock is called (a trigger before the update waits for an
// advisory lock the test holds); waiting is as blockAtCommit's.
func blockAtUpdate(t *testing.T, pool *pgxpool.Pool, key, when string) (unlock func(), waiting func(event string) int) {
	t.Helper()
	return holdAtLock(t, pool, fmt.Sprintf(`
CREATE FUNCTION test_block_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.idempotency_key = '%s' AND %s THEN
        PERFORM pg_advisory_xact_lock_shared(4343);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_block_update BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION test_block_update();`, key, when))
}

// holdAtLock creates trigger, whose function waits for advisory lock 4343, takes that
// lock for the test, and returns what releases it and what counts the sessions of pool's
// database waiting for an event (see sessionsWaiting).
func holdAtLock(t *testing.T, pool *pgxpool.Pool, trigger string) (unlock func(), waiting func(event string) int) {
	t.Helper()
	ctx := t.Context()
	_, err := pool.Exec(ctx, trigger)
	require.NoError(t, err)
	locker, err := pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(locker.Release)
	_, err = locker.Exec(ctx, `SELECT pg_advisory_lock(4343)`)
	require.NoError(t, err)
	unlock = func() {
		_, err := locker.Exec(ctx, `SELECT pg_advisory_unlock(4343)`)
		require.NoError(t, err)
	}
	waiting = func(event string) int { return sessionsWaiting(t, pool, event) }
	return unlock, waiting
}

// sessionsWaiting counts the sessions of pool's database waiting for one of events
// (pg_stat_activity's wait_event: advisory, transactionid, tuple, relation, ...).
func sessionsWaiting(t *testing.T, pool *pgxpool.Pool, events ...string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event = ANY($1) AND datname = current_database()`, events).Scan(&n))
	return n
}

// waitingPID returns the process id of the one session of pool's database waiting for
// event.
func waitingPID(t *testing.T, pool *pgxpool.Pool, event string) int {
	t.Helper()
	var pid int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity WHERE wait_event = $1 AND datname = current_database()`,
		event).Scan(&pid))
	return pid
}

// sessionGone reports whether the session of process pid has ended.
func sessionGone(t *testing.T, pool *pgxpool.Pool, pid int) bool {
	t.Helper()
	var gone bool
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&gone))
	return gone
}
