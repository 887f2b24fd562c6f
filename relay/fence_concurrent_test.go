package relay

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// Two fences may run at once: the maintainer's reclaim hands back lost rounds
// (releaseAgain) while the claim loop writes outcomes again, and so do the stopping
// relay's releases and its recorder. fencePending took the sessions off the list while
// it ended them, so the other found none and wrote again at once, while the lost write
// still ran in the database: the race fence is there to close. A session now stays
// listed until it has ended, and every caller ends it (or sees it ended).
func TestOutcomeWrittenAgainDuringAnotherFenceWaitsForTheLostWrite(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	ctx := t.Context()
	r, err := New(pgtest.InMode(t, proxy.pool, pgx.QueryExecModeExec), cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	o := claimedOutcome(t, r, direct, clock, "fenced")
	args := r.recordArgs([]outcome{o})

	locker, err := direct.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(ctx) })
	_, err = locker.Exec(ctx, `LOCK TABLE outbox IN SHARE ROW EXCLUSIVE MODE`)
	require.NoError(t, err)
	waitingBut := func(pid int) int {
		var n int
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event = 'relation' AND datname = current_database() AND pid <> $1`, pid).Scan(&n))
		return n
	}

	// The first write waits for the table when its connection breaks.
	first := make(chan error, 1)
	go func() { first <- r.execRecord(ctx, []outcome{o}, args) }()
	require.Eventually(t, func() bool { return waitingBut(0) == 1 }, waitTimeout, 10*time.Millisecond, "the first write waits for the table")
	lost := waitingPID(t, direct, "relation")
	proxy.partition()
	proxy.restore()
	require.True(t, unsure(<-first), "the first write's fate is unknown")

	// Another fence (reclaim's releaseAgain, say) is under way, its statement held up.
	held, release := proxy.holdOnce(t, "pg_terminate_backend")
	fenced := make(chan error, 1)
	go func() { fenced <- r.fencePending(ctx) }()
	waitFor(t, held, "the other fence never sent its statement")

	// The outcome is written again meanwhile: not before the first write has ended.
	o.maybeWritten = true
	again := make(chan error, 1)
	go func() { again <- r.execRecord(ctx, []outcome{o}, args) }()
	require.Eventually(t, func() bool { return waitingBut(lost) == 1 }, waitTimeout, 10*time.Millisecond, "the second write waits for the table")
	require.True(t, sessionGone(t, direct, lost), "the outcome was written again while the lost write still ran")

	release()
	require.NoError(t, <-fenced)
	require.NoError(t, locker.Commit(ctx))
	require.NoError(t, <-again)
	att := attemptsOf(t, direct, "fenced")
	require.Len(t, att, 1, "attempts log: %+v", att)
}
