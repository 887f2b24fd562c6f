package pgcluster

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStartRemovesWhatACrashLeft: a process killed without calling Stop (a test binary
// that panicked or timed out, a demo killed with SIGKILL) takes its server with it but
// leaves its directory; the next Start removes it.
// Not parallel: it sets TMPDIR.
func TestStartRemovesWhatACrashLeft(t *testing.T) {
	base := t.TempDir()
	reachable(t, base)
	t.Setenv("TMPDIR", base)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashHelperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var dir string
	for sc := bufio.NewScanner(stdout); sc.Scan(); {
		if d, ok := strings.CutPrefix(sc.Text(), "dir="); ok {
			dir = d
			break
		}
	}
	require.NotEmpty(t, dir, "the helper started a cluster")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	// The parent death signal stops its server; the directory stays.
	require.Eventually(t, func() bool { return !serverRuns(filepath.Join(dir, "data")) },
		30*time.Second, 10*time.Millisecond)
	require.DirExists(t, dir)

	c, err := Start(t.Context(), Options{Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Stop()) })
	require.NoDirExists(t, dir, "the crashed process's directory is removed")
	require.DirExists(t, c.dir)
}

// nsHelperEnv makes the test binary nsHelper, for TestSweepLeavesAnotherPIDNamespace.
const nsHelperEnv = "PGCLUSTER_NS_HELPER"

// nsHelper runs in a PID namespace of its own, with its own /proc, as a test binary in
// a container sharing the temp directory does: it creates a cluster directory under
// TMPDIR as Start does, prints it, and blocks until killed, its creator alive all along.
func nsHelper() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		fail(err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		fail(err)
	}
	dir, err := os.MkdirTemp(os.TempDir(), "outboxd-pg-")
	if err != nil {
		fail(err)
	}
	if err := markCreator(dir); err != nil {
		fail(err)
	}
	fmt.Printf("dir=%s\n", dir)
	_, _ = io.Copy(io.Discard, os.Stdin) // until killed
}

// TestSweepLeavesAnotherPIDNamespace: a directory whose creator runs in another PID
// namespace (a container sharing the temp directory) is in use, though its pid here
// names another process or none; while it is being created (initdb running, no
// postmaster.pid yet), or when its server listens in another network namespace, nothing
// else tells that it is. The sweep removed it.
func TestSweepLeavesAnotherPIDNamespace(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nsHelperEnv+"=1", "TMPDIR="+base)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a process in a PID namespace of its own: %v", err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	var dir string
	for sc := bufio.NewScanner(stdout); sc.Scan(); {
		if d, ok := strings.CutPrefix(sc.Text(), "dir="); ok {
			dir = d
			break
		}
	}
	if dir == "" {
		// It could start in a namespace of its own and not mount /proc there (a
		// sandbox that allows the one and not the other).
		_ = cmd.Wait() // stderr is complete
		t.Skipf("the helper did not create a cluster directory in a PID namespace of its own: %s", strings.TrimSpace(stderr.String()))
	}

	sweepStale(base, t.Logf)
	require.DirExists(t, dir, "the directory of a creator in another PID namespace is left alone")
}
