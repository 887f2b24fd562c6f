package proccpu

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestChildRunAndReapedBetweenSamplesCounts: a child that starts, works and exits
// between two samples used that CPU inside the window, and its parent (the postmaster,
// for a PostgreSQL backend, a parallel worker or an autovacuum worker that lives less
// than a phase) holds it once it has reaped the child. The phase's CPU must include it:
// counting nothing for it made PostgreSQL's CPU per delivery look smaller than it was.
func TestChildRunAndReapedBetweenSamplesCounts(t *testing.T) {
	before, found := Tree(os.Getpid())
	require.True(t, found)
	cmd := exec.Command("/bin/sh", "-c", `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`)
	require.NoError(t, cmd.Run()) // started, worked, exited and reaped
	used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	require.GreaterOrEqual(t, used, 50*time.Millisecond, "the shell's loop burns CPU")
	after, found := Tree(os.Getpid())
	require.True(t, found)
	// /proc counts in ticks of 10 ms, rusage in microseconds.
	require.GreaterOrEqual(t, after.Since(before), used-2*time.Second/userHZ,
		"the child used %s between the samples", used)
}
