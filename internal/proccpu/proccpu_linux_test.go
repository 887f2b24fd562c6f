package proccpu

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The CPU a process tree used is read from /proc: this process's own, after it burned
// some, counts in both measures.
func TestCPUMeasures(t *testing.T) {
	self0, ok := Self()
	require.True(t, ok)
	tree0, found := Tree(os.Getpid())
	require.True(t, found)
	burn := 0
	for self, _ := Self(); self-self0 < 100*time.Millisecond; self, _ = Self() {
		for i := range 100000 {
			burn += i
		}
	}
	tree1, found := Tree(os.Getpid())
	require.True(t, found)
	require.GreaterOrEqual(t, tree1.Since(tree0), 50*time.Millisecond, "burned %d", burn)
	require.GreaterOrEqual(t, tree1.Total()-tree0.Total(), 50*time.Millisecond)
	_, found = Tree(0)
	require.False(t, found)
}

// A child that exits between two samples takes none of the others' CPU away (a
// bench's raw phase reported -40 ms of PostgreSQL's CPU when a backend exited during
// it), and one started between them counts whole.
func TestChildrenStartingAndExitingBetweenSamples(t *testing.T) {
	// A child that burns at least 200 ms of CPU, then waits to be killed.
	burner := func() *exec.Cmd {
		cmd := exec.Command("/bin/sh", "-c", `i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo done; exec sleep 60`)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		_, err = out.Read(make([]byte, 4)) // "done": the loop is over
		require.NoError(t, err)
		return cmd
	}
	childCPU := func(s Sample, pid int) time.Duration {
		var d time.Duration
		for p, ticks := range s.ticks {
			if p.pid == pid {
				d += ticksToDuration(ticks)
			}
		}
		return d
	}

	// Started between the samples: counts with all it used.
	before, _ := Tree(os.Getpid())
	started := burner()
	after, _ := Tree(os.Getpid())
	used := childCPU(after, started.Process.Pid)
	require.GreaterOrEqual(t, used, 50*time.Millisecond, "the shell's loop burns CPU")
	require.GreaterOrEqual(t, after.Since(before), used)

	// Exited between the samples: what it used before the first is not taken away.
	before, _ = Tree(os.Getpid())
	require.GreaterOrEqual(t, childCPU(before, started.Process.Pid), 50*time.Millisecond)
	require.NoError(t, started.Process.Kill())
	_ = started.Wait()
	after, _ = Tree(os.Getpid())
	require.Zero(t, childCPU(after, started.Process.Pid))
	require.GreaterOrEqual(t, after.Since(before), time.Duration(0))
	require.Less(t, after.Total(), before.Total(), "a difference of totals would be negative here")
}
