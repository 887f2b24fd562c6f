package main

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgcluster"
)

// TestBenchTargetsNeedDurableStorage: the throwaway cluster lives under TMPDIR, which
// may be a tmpfs (/tmp is one on many systems). Its fsync then reaches no disk, so the
// bench says so and meets no target, whatever its figures; it reported fsync=on and
// counted them as met.
func TestBenchTargetsNeedDurableStorage(t *testing.T) {
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("bench needs the PostgreSQL server binaries (apt-get install postgresql): %v", err)
	}
	var fs syscall.Statfs_t
	require.NoError(t, syscall.Statfs("/dev/shm", &fs))
	require.EqualValues(t, 0x01021994, fs.Type, "the test needs /dev/shm on tmpfs")
	t.Setenv("TMPDIR", "/dev/shm") // not parallel: the cluster's directory follows TMPDIR

	rep, stderr := benchJSON(t, nil, "--rows", "10", "--concurrency", "2", "--rate", "20", "--duration", "1s")
	require.Contains(t, stderr, "is on tmpfs, in memory: its fsync reaches no disk")
	require.Equal(t, "on", rep.Postgres.Fsync)
	require.Len(t, rep.Targets, 4)
	for _, tg := range rep.Targets {
		require.False(t, tg.Met, "%s: met on tmpfs", tg.Name)
		require.Contains(t, tg.Name, "(not counted: the data directory is on tmpfs)")
	}
}
