package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// childArgsEnv makes the test binary run the command line it holds (see TestMain), so a
// test can interrupt a real `outboxd demo` or `outboxd bench` as a terminal does.
const childArgsEnv = "OUTBOX_TEST_CHILD_ARGS"

// childHoldEnv, set in a child's environment, holds the child's standard output, as a
// terminal whose output is paused holds it, from the write that shows its value until
// the child gets SIGINT or SIGTERM (see runChild): whatever prints that line waits
// there, so a test that sees the line knows where the child stands however late it
// looks.
const childHoldEnv = "OUTBOX_TEST_CHILD_HOLD"

// runChild runs the command line args as the whole process, as runProcess does, with
// its standard output held as childHoldEnv says.
func runChild(args []string) int {
	marker := os.Getenv(childHoldEnv)
	if marker == "" {
		return runProcess(args)
	}
	// Registered before the command runs, so a signal that comes before the line is
	// not missed: the line then passes at once.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	stdout := &holdingWriter{w: os.Stdout, marker: []byte(marker), signals: signals}
	return runEnv(context.Background(), args, &env{
		environ: os.Environ(), stdin: os.Stdin, stdout: stdout, stderr: os.Stderr, ownsProcess: true,
	})
}

// holdingWriter writes to w, and the first write that holds marker returns only once
// signals delivers a signal. The command's own handler gets the signal as well.
type holdingWriter struct {
	w       io.Writer
	marker  []byte
	signals chan os.Signal
	held    sync.Once
}

func (h *holdingWriter) Write(p []byte) (int, error) {
	n, err := h.w.Write(p)
	if bytes.Contains(p, h.marker) {
		h.held.Do(func() {
			<-h.signals
			// From here on the command's handler alone decides what a signal does.
			signal.Stop(h.signals)
		})
	}
	return n, err
}

// childProcess is `outboxd <args>` running as a process of its own, the leader of its
// own process group, as a shell runs a foreground job.
type childProcess struct {
	cmd            *exec.Cmd
	stdout, stderr *markerBuffer
	tmpDir         string        // the child's TMPDIR, where a throwaway cluster goes
	exited         chan struct{} // closed once the child exited
	waitErr        error         // read after exited is closed
}

// startChild starts `outboxd <args>` with environ added to the test's environment (none
// of whose OUTBOX_ variables it inherits), and a TMPDIR of its own.
func startChild(t *testing.T, args string, environ ...string) *childProcess {
	t.Helper()
	c := newChild(t, args, environ...)
	c.start(t)
	return c
}

// newChild is startChild's process before it starts, for a test to change how (its
// stdout, say).
func newChild(t *testing.T, args string, environ ...string) *childProcess {
	t.Helper()
	// The throwaway cluster runs as the postgres user when we are root: it must reach
	// the directory, which t.TempDir creates for us alone.
	tmpDir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(tmpDir), 0o755))
	require.NoError(t, os.Chmod(tmpDir, 0o755))
	env := make([]string, 0, len(os.Environ())+len(environ)+2)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") && !strings.HasPrefix(kv, "TMPDIR=") {
			env = append(env, kv)
		}
	}
	env = append(append(env, childArgsEnv+"="+args, "TMPDIR="+tmpDir), environ...)
	c := &childProcess{stdout: &markerBuffer{}, stderr: &markerBuffer{}, tmpDir: tmpDir, exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = c.stdout, c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return c
}

// start starts a child from newChild.
func (c *childProcess) start(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Start())
	go func() { c.waitErr = c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.exited
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("child stdout:\n%s\nchild stderr:\n%s", c.stdout.String(), c.stderr.String())
		}
	})
}

// waitOutput waits until the child's stdout or stderr shows marker.
func (c *childProcess) waitOutput(t *testing.T, marker string) {
	t.Helper()
	select {
	case <-c.stdout.seen(marker):
	case <-c.stderr.seen(marker):
	case <-c.exited:
		t.Fatalf("the child exited (%v) before printing %q", c.waitErr, marker)
	case <-time.After(processWait):
		t.Fatalf("the child did not print %q within %s", marker, processWait)
	}
}

// interrupt sends sig to the child's process group, as a terminal's Ctrl-C sends SIGINT
// to the foreground job, and waits for the child to exit.
func (c *childProcess) interrupt(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, syscall.Kill(-c.cmd.Process.Pid, sig))
	select {
	case <-c.exited:
	case <-time.After(processWait):
		t.Fatalf("the child did not exit within %s of %s", processWait, sig)
	}
}

// requireNothingLeft checks that no throwaway cluster directory is left in the child's
// TMPDIR, no process in its process group, and no process running from its TMPDIR: the
// throwaway PostgreSQL runs in a process group of its own (see pgcluster), so the group
// alone does not show a server left running. Its command line names its data
// directory, under the child's TMPDIR; that is looked for in /proc, where there is one.
func (c *childProcess) requireNothingLeft(t *testing.T) {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(c.tmpDir, "outboxd-pg-*"))
	require.NoError(t, err)
	require.Empty(t, left, "cluster directories left behind")
	err = syscall.Kill(-c.cmd.Process.Pid, 0)
	require.ErrorIs(t, err, syscall.ESRCH, "processes of the child's group left running")
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	require.NoError(t, err)
	var running []string
	for _, path := range cmdlines {
		b, err := os.ReadFile(path) // a process that exited meanwhile: nothing to read
		if err == nil && bytes.Contains(b, []byte(c.tmpDir)) {
			running = append(running, filepath.Base(filepath.Dir(path))+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	require.Empty(t, running, "processes left running from the child's TMPDIR")
}

// markerBuffer is a bytes buffer that a child process writes to while the test reads,
// and that tells when a marker appears in it.
type markerBuffer struct {
	mu      sync.Mutex
	buf     strings.Builder
	waiters map[string]chan struct{}
}

func (b *markerBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	for marker, ch := range b.waiters {
		if strings.Contains(b.buf.String(), marker) {
			close(ch)
			delete(b.waiters, marker)
		}
	}
	return n, err
}

// seen returns a channel closed once the buffer holds marker.
func (b *markerBuffer) seen(marker string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	if strings.Contains(b.buf.String(), marker) {
		close(ch)
		return ch
	}
	if b.waiters == nil {
		b.waiters = map[string]chan struct{}{}
	}
	if old, ok := b.waiters[marker]; ok {
		return old
	}
	b.waiters[marker] = ch
	return ch
}

func (b *markerBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDemoCtrlC interrupts `outboxd demo` as Ctrl-C in a terminal does: SIGINT to its
// whole process group, while its rows are being delivered. The demo must stop what it
// started itself, in order: the relay while its database is still there (so the relay
// has nothing to complain about), then the throwaway PostgreSQL, whose directory goes too.
func TestDemoCtrlC(t *testing.T) {
	t.Parallel()

	// The first 503 of the row that fails twice: the relay has rows in hand. The demo
	// would finish about half a second later and exit 0, before a signal sent late on a
	// busy machine; so the child holds its output at that line (childHoldEnv): the
	// delivery that printed it, and with it the demo, waits there for the signal. The
	// demo's handler gets that signal as the line is let through, when the row still
	// has two retries to go, each a backoff away.
	const marker = "attempt 1 failed"
	c := startChild(t, "demo", childHoldEnv+"="+marker)
	c.waitOutput(t, marker)
	c.interrupt(t, syscall.SIGINT)
	require.Equal(t, exitFailure, c.cmd.ProcessState.ExitCode())
	require.Contains(t, c.stderr.String(), "interrupt signal received")
	// The relay's log shows problems only (level warn): there must be none, such as
	// outcomes it could not record because PostgreSQL had already shut down.
	require.NotContains(t, c.stderr.String(), "level=", "the relay logged problems while the demo stopped")
	c.requireNothingLeft(t)
}
