package relay

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// An outcome's write is still queued in the database, behind a table lock taken before
// it reached its rows (CREATE TRIGGER, as outboxd migrate runs, takes SHARE ROW
// EXCLUSIVE on outbox), when the network breaks; the relay writes it again. lockAgainSQL
// is let through by that lock (row locks need only ROW SHARE) and takes the rows first,
// so the second write committed first, and the first then logged the attempt again:
// recordSQL logs every attempt, whether its row was written or not. (With prepared
// statements the second write waits for the table while it prepares, before
// lockAgainSQL runs, and came second by luck.) The relay now ends the first write's
// session before it writes again (see fence).
func TestOutcomeWrittenAgainWhileTheFirstWriteIsQueuedIsLoggedOnce(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	ctx := t.Context()
	// Statements sent as they come, unprepared (default_query_exec_mode=exec, as
	// behind a pooler, or statements already prepared on the connection): a batch's
	// statements take their locks one after the other.
	r, err := New(pgtest.InMode(t, proxy.pool, pgx.QueryExecModeExec), cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	o := claimedOutcome(t, r, direct, clock, "queued")

	locker, err := direct.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(ctx) })
	_, err = locker.Exec(ctx, `LOCK TABLE outbox IN SHARE ROW EXCLUSIVE MODE`)
	require.NoError(t, err)
	waiting := func(event string) int { return sessionsWaiting(t, direct, event) }

	done := make(chan struct{})
	go func() { defer close(done); r.writeOutcomes(ctx, []outcome{o}) }()
	require.Eventually(t, func() bool { return waiting("relation") == 1 }, waitTimeout, 10*time.Millisecond, "the first write waits for the table")
	first := waitingPID(t, direct, "relation")
	proxy.partition() // the relay writes it again once the database answers
	proxy.restore()
	require.Eventually(t, func() bool {
		return sessionGone(t, direct, first) && waiting("relation") == 1
	}, waitTimeout, 10*time.Millisecond, "the first write's session is ended, and the second write waits for the table")
	require.NoError(t, locker.Commit(ctx))
	<-done
	// The first write's session ends once it has run (or been ended).
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state <> 'idle' AND pid <> pg_backend_pid()`).Scan(&n))
		return n == 0
	}, waitTimeout, 10*time.Millisecond)

	in, err := outbox.Get(ctx, direct, "queued")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status)
	att := attemptsOf(t, direct, "queued")
	require.Len(t, att, 1, "attempts log: %+v", att)
}
