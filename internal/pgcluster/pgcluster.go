package pgcluster

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotFound is returned by [FindBinDir] and [Start] when no PostgreSQL server binaries
// are installed.
var ErrNotFound = errors.New("no PostgreSQL found: install the server (apt-get install postgresql), " +
	"which provides initdb and pg_ctl on PATH or under /usr/lib/postgresql/*/bin")

// Timeouts for the steps of starting and stopping. initdb takes a couple of seconds; the
// others are normally well under one.
const (
	pgCtlWaitSeconds = 60               // pg_ctl stop -t
	exitTimeout      = 10 * time.Second // for postgres to exit once pg_ctl stop returned
	readyTimeout     = 30 * time.Second // pgx ping loop after pg_ctl start returned
	stopTimeout      = 2 * time.Minute  // whole of Stop, which takes no context
	startAttempts    = 3                // tries with a fresh port when another process took ours
	maxSocketPath    = 103              // longest Unix socket path PostgreSQL accepts everywhere
)

// Options configure [Start]. The zero value is a fast cluster for tests.
type Options struct {
	// Fsync turns fsync and full_page_writes on, so that commits are durable and
	// benchmarks measure what production pays. Defaults to false: both off, for speed.
	Fsync bool

	// ExtraSettings are more postgresql.conf settings (name to value). They are written
	// after ours, so they override them. Defaults to none.
	ExtraSettings map[string]string

	// Logf, when set, is told about each step: initdb, start, stop and retries.
	// Defaults to silence.
	Logf func(format string, args ...any)
}

// Cluster is a running throwaway PostgreSQL cluster started by [Start]. It listens on
// 127.0.0.1 only, trusts every connection, and has a superuser named postgres. Its methods
// are safe for concurrent use.
type Cluster struct {
	binDir  string
	dir     string // the temporary directory: data/, the Unix socket, postgres.log
	dataDir string
	logPath string
	owner   *owner // OS user the server runs as; nil means the current user
	logf    func(format string, args ...any)
	port    int // set by Start, fixed after

	mu      sync.Mutex
	proc    *process // nil while stopped
	removed bool
}

// Start creates a cluster in a new temporary directory with initdb, starts it on a free
// loopback port and returns once it accepts connections. Call [Cluster.Stop] to shut it
// down and remove the directory.
//
// ctx bounds starting only; the cluster keeps running after ctx ends.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	binDir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	own, err := serverOwner()
	if err != nil {
		return nil, err
	}
	// Absolute: the server binaries run in the cluster directory, where a relative
	// TMPDIR would name another place.
	base, err := filepath.Abs(tempBase(own))
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	sweepStale(base, logf)
	dir, err := os.MkdirTemp(base, "outboxd-pg-")
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	c := &Cluster{
		binDir:  binDir,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "postgres.log"),
		owner:   own,
		logf:    logf,
	}
	started := false
	defer func() {
		if !started {
			_ = c.Stop() // also removes dir
		}
	}()
	if err := markCreator(dir); err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}

	// initdb creates data/ itself, as the server's user, so only dir needs handing over.
	if err := own.chown(dir); err != nil {
		return nil, fmt.Errorf("hand cluster directory to the postgres user: %w", err)
	}
	c.logf("pgcluster: initdb in %s with %s", c.dataDir, binDir)
	if _, err := c.run(ctx, "initdb", "-D", c.dataDir, "-A", "trust", "-U", "postgres",
		"--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, fmt.Errorf("initdb: %w", err)
	}
	if err := c.writeSettings(opts); err != nil {
		return nil, err
	}

	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		c.port = port
		err = c.start(ctx)
		if err == nil {
			break
		}
		// The port was free when we picked it, but another process may have taken it
		// before postgres bound it. Only that case is worth another try.
		if attempt < startAttempts && ctx.Err() == nil && portTaken(port) {
			c.logf("pgcluster: port %d was taken before postgres bound it; retrying on another", port)
			continue
		}
		return nil, err
	}
	started = true
	return c, nil
}

// URL returns the DSN of database dbname on the cluster, as the superuser postgres,
// for example postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable. The database
// postgres always exists.
func (c *Cluster) URL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port(), url.PathEscape(dbname))
}

// Port returns the TCP port the cluster listens on, on 127.0.0.1. It does not change
// across [Cluster.Restart].
func (c *Cluster) Port() int { return c.port }

// PID returns the process id of the server's postmaster, whose children are its
// backends and background workers, or 0 while it is stopped.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0
	}
	return c.proc.cmd.Process.Pid
}

// Restart stops the server with a fast shutdown (which disconnects every client) and
// starts it again on the same port and data directory, returning once it accepts
// connections. Committed data survives.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return errors.New("restart postgres: cluster already stopped")
	}
	if err := c.stop(ctx); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	if err := c.start(ctx); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	return nil
}

// Stop shuts the server down (fast shutdown, falling back to immediate) and removes the
// cluster's directory. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil
	}
	c.removed = true

	ctx, cancel := context.WithTimeoutCause(context.Background(), stopTimeout,
		errors.New("stopping postgres took too long"))
	defer cancel()
	var errs []error
	if err := c.stop(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove cluster directory: %w", err))
	}
	return errors.Join(errs...)
}

// start runs postgres on c.port as a child of this process and waits until it accepts
// connections. The caller holds c.mu or owns c exclusively.
//
// The server is our child, rather than a daemon started by pg_ctl start, so that it dies
// with this process: it gets SIGQUIT (immediate shutdown) when we exit without calling
// Stop, for instance when `go test` kills a test binary that timed out. A daemon would
// keep running, and keep its memory, until someone noticed.
func (c *Cluster) start(ctx context.Context) error {
	c.logf("pgcluster: starting postgres on 127.0.0.1:%d", c.port)
	logFile, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start postgres: open server log: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), "-D", c.dataDir, "-p", strconv.Itoa(c.port))
	cmd.Dir = c.dir
	// Files, not pipes: no goroutine copies output, and nothing waits for the
	// server's backends to close a pipe.
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = withParentDeathSignal(withOwnProcessGroup(c.owner.sysProcAttr()))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	c.proc = p

	if err := c.waitReady(ctx, p); err != nil {
		if ctx.Err() != nil {
			// Stopped from outside (Ctrl-C, a deadline) while the server was starting:
			// its log and the last failed ping say what it was doing, not why it
			// stopped, and would read as a server that failed to start.
			err = context.Cause(ctx)
		} else {
			err = fmt.Errorf("%w%s", err, c.logTail())
		}
		if stopErr := c.stop(context.WithoutCancel(ctx)); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return fmt.Errorf("start postgres: %w", err)
	}
	c.logf("pgcluster: postgres accepts connections on 127.0.0.1:%d", c.port)
	return nil
}

// stop shuts the server down with pg_ctl stop -m fast, then -m immediate if that fails,
// and waits for the process to exit. The caller holds c.mu or owns c exclusively.
func (c *Cluster) stop(ctx context.Context) error {
	p := c.proc
	if p == nil {
		return nil
	}
	c.proc = nil
	select {
	case <-p.exited:
		return nil // died on its own; start reports why, through the log
	default:
	}

	c.logf("pgcluster: stopping postgres on 127.0.0.1:%d", c.port)
	var errs []error
	wait := strconv.Itoa(pgCtlWaitSeconds)
	if _, fastErr := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", "fast", "-w", "-t", wait); fastErr != nil {
		c.logf("pgcluster: fast shutdown failed (%v); trying immediate", fastErr)
		if _, err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", "immediate", "-w", "-t", wait); err != nil {
			// pg_ctl finds the server through postmaster.pid, which a server that has
			// just been started (a start cut short by Ctrl-C) may not have written yet.
			// It is our child: ask it for a fast shutdown directly (SIGINT, which also
			// ends it before it has set up its handlers), rather than wait and kill it,
			// which leaves its backends and shared memory to clean up after it.
			if sigErr := p.cmd.Process.Signal(os.Interrupt); sigErr == nil {
				c.logf("pgcluster: pg_ctl could not stop postgres (%v); sent it SIGINT", err)
			} else {
				errs = append(errs, fastErr, err)
			}
		}
	}
	// pg_ctl returns once postmaster.pid is gone, just before the process exits. When
	// nothing stopped it, kill it.
	select {
	case <-p.exited:
	case <-time.After(exitTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		errs = append(errs, errors.New("postgres did not exit after pg_ctl stop, so it was killed"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("stop postgres: %w", errors.Join(errs...))
	}
	return nil
}

// process is a running postgres, child of this process.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned
	err    error         // what cmd.Wait returned; read after exited is closed
}

// waitReady pings the server over TCP until it answers, and fails early if it exits.
// Only our server counts: another one that took the port first (another test binary's
// cluster, with the same user and trust) answers too, while ours fails to bind it.
func (c *Cluster) waitReady(ctx context.Context, p *process) error {
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", c.port)
	return p.waitAnswers(ctx, "postgres", func(ctx context.Context) error { return ping(ctx, dsn, c.dataDir) })
}

// waitAnswers calls ping until it succeeds, for up to readyTimeout, and fails early if
// p, the program called name, exits.
func (p *process) waitAnswers(ctx context.Context, name string, ping func(context.Context) error) error {
	ctx, cancel := context.WithTimeoutCause(ctx, readyTimeout,
		fmt.Errorf("%s did not accept connections within %s", name, readyTimeout))
	defer cancel()
	// A ping can hang until connect_timeout on a port that another program took (it
	// accepts, then never answers); the program exiting cuts it short.
	ctx, cancelExit := context.WithCancelCause(ctx)
	defer cancelExit(nil)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-p.exited:
			cancelExit(fmt.Errorf("%s exited: %v", name, p.err))
		case <-done:
		}
	}()
	for {
		err := ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", context.Cause(ctx), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ping connects to dsn and checks that the server answering runs on dataDir.
func ping(ctx context.Context, dsn, dataDir string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dir string
	if err := conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dir); err != nil {
		return err
	}
	if dir != dataDir {
		return fmt.Errorf("the server on this port is another one, on %s", dir)
	}
	return nil
}

// ClearClientEnvironment unsets the environment variables that libpq reads, and pgx
// after it, for every connection whose URL does not say otherwise (PGSERVICE,
// PGOPTIONS, PGREQUIREAUTH, PGCHANNELBINDING, PGTARGETSESSIONATTRS and the rest), for a
// process whose connections all go to a cluster of its own, which none of them is
// meant for. A user keeps them for psql and their own databases; under a throwaway
// cluster's URL they made its connections fail (a read-only PGOPTIONS, an
// authentication requirement trust does not meet) or not even parse (a PGSERVICE that
// pgx, which reads only ~/.pg_service.conf, cannot find), and the caller then waited
// 30 s for a server that was up.
func ClearClientEnvironment() {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "PG") {
			_ = os.Unsetenv(name)
		}
	}
}

// writeSettings appends our settings to postgresql.conf. Later lines win, so they
// override initdb's defaults, and ExtraSettings (written last) override ours.
func (c *Cluster) writeSettings(opts Options) error {
	onOff := map[bool]string{true: "on", false: "off"}
	// The default, /var/run/postgresql, may not exist or be writable; a private
	// directory also keeps parallel clusters from clashing on socket names. A socket
	// path longer than a sockaddr_un holds (103 bytes on macOS, 107 on Linux) stops the
	// server, so under a long TMPDIR there is no socket: clients use TCP anyway.
	socketDir := c.dir
	if len(c.dir)+len("/.s.PGSQL.65535") > maxSocketPath {
		socketDir = ""
	}
	settings := [][2]string{
		{"listen_addresses", "127.0.0.1"},
		{"unix_socket_directories", socketDir},
		{"fsync", onOff[opts.Fsync]},
		// Torn pages only matter after an OS crash, which fsync=off gives up on anyway.
		{"full_page_writes", onOff[opts.Fsync]},
		{"max_connections", "300"},
		{"shared_buffers", "128MB"},
	}
	for _, name := range slices.Sorted(maps.Keys(opts.ExtraSettings)) {
		settings = append(settings, [2]string{name, opts.ExtraSettings[name]})
	}

	var b strings.Builder
	b.WriteString("\n# Added by outboxd internal/pgcluster.\n")
	for _, s := range settings {
		fmt.Fprintf(&b, "%s = '%s'\n", s[0], strings.ReplaceAll(s[1], "'", "''"))
	}
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		_ = f.Close()
		return fmt.Errorf("write settings: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	return nil
}

// run runs one of the server binaries as the server's user, in the cluster directory
// (the caller's working directory may be unreadable for that user), and returns its
// combined output. A failure's error includes the output.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.dir
	cmd.SysProcAttr = c.owner.sysProcAttr()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// Should a child of the command keep our output pipe open, don't wait for it.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			// Stopped from outside (Ctrl-C, a deadline): the output of the step cut
			// short, a screenful from initdb, says what it was doing, not why it stopped.
			return out.Bytes(), context.Cause(ctx)
		}
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err,
			strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}

// logTail returns the end of the server log, formatted to follow an error message.
func (c *Cluster) logTail() string {
	f, err := os.Open(c.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	const tailBytes = 2048
	if fi, err := f.Stat(); err == nil && fi.Size() > tailBytes {
		_, _ = f.Seek(-tailBytes, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	return "\nserver log (" + c.logPath + "):\n" + s
}

// FindBinDir returns the directory holding the PostgreSQL server binaries: the one of
// initdb and pg_ctl on PATH (after following symlinks), else the newest
// /usr/lib/postgresql/<version>/bin. It returns [ErrNotFound] when there is none.
func FindBinDir() (string, error) {
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			// Debian links /usr/local/bin/initdb and friends to the versioned directory;
			// the real one holds postgres too.
			if real, err := filepath.EvalSymlinks(initdb); err == nil && hasServer(filepath.Dir(real)) {
				return filepath.Dir(real), nil
			}
			if hasServer(filepath.Dir(initdb)) {
				return filepath.Dir(initdb), nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	dirs = slices.DeleteFunc(dirs, func(d string) bool { return !hasServer(d) })
	if len(dirs) == 0 {
		return "", ErrNotFound
	}
	// Newest first by major version: "9.6" < "10" < "17", which a string sort gets wrong.
	slices.SortFunc(dirs, func(a, b string) int { return compareVersion(versionOf(b), versionOf(a)) })
	return dirs[0], nil
}

func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// versionOf returns the version directory of /usr/lib/postgresql/<version>/bin.
func versionOf(binDir string) string { return filepath.Base(filepath.Dir(binDir)) }

// compareVersion compares dotted numeric versions; non-numeric parts compare as 0.
func compareVersion(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return 0
}

// freePort asks the kernel for a free loopback port. Another process can take it before
// postgres binds it; Start retries then.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portTaken reports whether something listens on 127.0.0.1:port.
func portTaken(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return true
	}
	_ = l.Close()
	return false
}
