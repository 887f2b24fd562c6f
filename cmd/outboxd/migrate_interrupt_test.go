package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// TestMigrateStopLeavesNoSessionWaiting stops `outboxd migrate` with SIGTERM, and then
// with SIGINT, while it waits for a lock (here the migration lock, which another session
// holds; in the field a long transaction on outbox, ahead of which the migration's
// lock request queues every writer). migrate used to die with the signal, and its
// server session, which does not notice a client gone while it waits for a lock, stayed
// in the queue until the lock came free; now the stop cancels the statement on the
// server, the transaction rolls back, and migrate exits 1 saying so.
func TestMigrateStopLeavesNoSessionWaiting(t *testing.T) {
	t.Parallel()

	dsn := pgtest.URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	// The migration lock (schema.go's migrateLockID), held by a session of the test's.
	holder, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	_, err = holder.Exec(t.Context(), `SELECT pg_advisory_lock(7345120001)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = holder.Exec(context.WithoutCancel(t.Context()), `SELECT pg_advisory_unlock_all()`)
		holder.Release()
	})

	waiting := func() int {
		var n int
		err := pool.QueryRow(context.WithoutCancel(t.Context()), `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND query = 'SELECT pg_advisory_xact_lock($1)'`).Scan(&n)
		if err != nil {
			return -1
		}
		return n
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		c := startChild(t, "migrate", "OUTBOX_DATABASE_URL="+dsn)
		require.Eventually(t, func() bool { return waiting() == 1 }, processWait, 10*time.Millisecond,
			"migrate never waited for the migration lock")

		c.interrupt(t, sig)
		require.Equal(t, exitFailure, c.cmd.ProcessState.ExitCode(), "%s: migrate exits 1, not killed by the signal", sig)
		require.Contains(t, c.stderr.String(), "before the migration finished", sig)
		require.Eventually(t, func() bool { return waiting() == 0 }, 10*time.Second, 10*time.Millisecond,
			"%s: migrate's session still waits for the lock after migrate exited", sig)
	}

	// The lock free, migrate runs as before.
	_, err = holder.Exec(t.Context(), `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	c := startChild(t, "migrate", "OUTBOX_DATABASE_URL="+dsn)
	select {
	case <-c.exited:
	case <-time.After(processWait):
		t.Fatalf("migrate did not finish within %s", processWait)
	}
	require.Equal(t, exitOK, c.cmd.ProcessState.ExitCode())
	require.Contains(t, c.stdout.String(), "schema already at version")
}
