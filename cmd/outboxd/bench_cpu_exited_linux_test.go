package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/proccpu"
)

// TestBenchPostgresCPUCountsExitedBackends: a PostgreSQL process that starts, works and
// exits within a phase (the relay's LISTEN connection, opened when the relay starts and
// closed when it stops; a parallel query's workers; an autovacuum worker) used its CPU
// inside the phase, and the postmaster holds it once it has reaped the process. The
// phase's PostgreSQL CPU counted nothing of it, so the CPU per delivery it reports was
// lower than what PostgreSQL spent.
func TestBenchPostgresCPUCountsExitedBackends(t *testing.T) {
	dsn := pgtest.URL(t)
	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	var backend int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&backend))
	postmaster := parentOf(t, backend)
	require.NoError(t, conn.Close(t.Context()))

	start := cpuNow(postmaster)
	// A connection of the phase: opened, busy, closed.
	conn, err = pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&backend))
	_, err = conn.Exec(t.Context(), `SELECT count(*) FROM generate_series(1, 3000000)`)
	require.NoError(t, err)
	s, ok := proccpu.Tree(backend)
	require.True(t, ok)
	used := s.Total()
	require.GreaterOrEqual(t, used, 50*time.Millisecond, "the query burns CPU in its backend")
	require.NoError(t, conn.Close(t.Context()))
	// The backend exits once it reads the connection's end; the postmaster reaps it.
	deadline := time.Now().Add(processWait)
	for tick := time.Tick(5 * time.Millisecond); processExists(backend); <-tick {
		require.True(t, time.Now().Before(deadline), "backend %d still running %s after its connection closed", backend, processWait)
	}
	got := cpuNow(postmaster).since(start)
	require.True(t, got.pgOK)
	require.GreaterOrEqual(t, got.pg, used,
		"PostgreSQL's CPU over the window: the backend that exited in it used %s", used)
}

// parentOf returns the parent process id of pid, from /proc.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	require.NoError(t, err)
	return ppid
}

func processExists(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}
