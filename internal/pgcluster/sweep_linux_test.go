package pgcluster

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
