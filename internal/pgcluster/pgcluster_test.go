package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashHelperEnv) != "" {
		crashHelper()
		return
	}
	if os.Getenv(nsHelperEnv) != "" {
		nsHelper()
		return
	}
	goleak.VerifyTestMain(m)
}

// crashHelperEnv makes the test binary crashHelper, for TestStartRemovesWhatACrashLeft.
const crashHelperEnv = "PGCLUSTER_CRASH_HELPER"

// crashHelper is the process TestStartRemovesWhatACrashLeft kills: it starts a
// cluster, prints its directory, and blocks until killed.
func crashHelper() {
	c, err := Start(context.Background(), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("dir=%s\n", c.dir)
	_, _ = io.Copy(io.Discard, os.Stdin) // until killed
}

func TestCluster(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		cluster *Cluster
	}

	setup := func(t *testing.T, opts Options) *testBundle {
		t.Helper()
		opts.Logf = t.Logf
		c, err := Start(t.Context(), opts)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Stop()) })
		return &testBundle{cluster: c}
	}

	connect := func(t *testing.T, c *Cluster) *pgx.Conn {
		t.Helper()
		conn, err := pgx.Connect(t.Context(), c.URL("postgres"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(t.Context())) })
		return conn
	}

	t.Run("StartRestartStop", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		bundle := setup(t, Options{})
		c := bundle.cluster

		conn := connect(t, c)
		var one int
		require.NoError(t, conn.QueryRow(ctx, `SELECT 1`).Scan(&one))
		require.Equal(t, 1, one)
		_, err := conn.Exec(ctx, `CREATE TABLE survivor (v text); INSERT INTO survivor VALUES ('kept')`)
		require.NoError(t, err)

		port := c.Port()
		require.NoError(t, c.Restart(ctx))
		require.Equal(t, port, c.Port())
		// The fast shutdown closed the old connection.
		require.Error(t, conn.Ping(ctx))

		var v string
		require.NoError(t, connect(t, c).QueryRow(ctx, `SELECT v FROM survivor`).Scan(&v))
		require.Equal(t, "kept", v)

		require.NoError(t, c.Stop())
		_, err = os.Stat(c.dir)
		require.ErrorIs(t, err, os.ErrNotExist)
		require.NoError(t, c.Stop(), "a second Stop is a no-op")
		require.Error(t, c.Restart(ctx))
	})

	t.Run("PortTaken", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		c := setup(t, Options{}).cluster

		c.mu.Lock()
		defer c.mu.Unlock()
		require.NoError(t, c.stop(ctx))
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)))
		require.NoError(t, err)
		// postgres exits at once; start notices (it says so) instead of pinging until its
		// deadline.
		err = c.start(ctx)
		require.ErrorContains(t, err, "postgres exited")
		require.Nil(t, c.proc)
		require.True(t, portTaken(c.port))

		require.NoError(t, l.Close())
		require.NoError(t, c.start(ctx))
	})

	t.Run("PortTakenByAnotherCluster", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		other := setup(t, Options{}).cluster
		c := setup(t, Options{}).cluster

		c.mu.Lock()
		defer c.mu.Unlock()
		require.NoError(t, c.stop(ctx))
		// Another test binary's cluster took the port: it answers pings as readily as
		// ours would, with the same user and trust, but it is not ours.
		c.port = other.port
		err := c.start(ctx)
		require.ErrorContains(t, err, "postgres exited")
		require.Nil(t, c.proc)
		require.True(t, portTaken(c.port))
	})

	t.Run("Settings", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		bundle := setup(t, Options{
			Fsync:         true,
			ExtraSettings: map[string]string{"application_name": "it's pgcluster", "max_connections": "40"},
		})

		conn := connect(t, bundle.cluster)
		show := func(name string) string {
			t.Helper()
			var v string
			require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v))
			return v
		}
		require.Equal(t, "on", show("fsync"))
		require.Equal(t, "on", show("full_page_writes"))
		require.Equal(t, "40", show("max_connections"), "ExtraSettings override ours")
		require.Equal(t, "128MB", show("shared_buffers"))
		require.Equal(t, "127.0.0.1", show("listen_addresses"))
		require.Equal(t, bundle.cluster.dir, show("unix_socket_directories"))
	})
}

func TestFindBinDir(t *testing.T) {
	t.Parallel()

	dir, err := FindBinDir()
	if err != nil {
		require.ErrorIs(t, err, ErrNotFound)
		return
	}
	require.True(t, hasServer(dir))
}

func TestCompareVersion(t *testing.T) {
	t.Parallel()

	require.Negative(t, compareVersion("9.6", "10"))
	require.Positive(t, compareVersion("17", "15"))
	require.Zero(t, compareVersion("16", "16"))
}

// TestStartRelativeTMPDIR: TMPDIR may be relative; the cluster must still start.
// Not parallel: it sets TMPDIR and changes the working directory.
func TestStartRelativeTMPDIR(t *testing.T) {
	wd := t.TempDir()
	reachable(t, wd)
	t.Chdir(wd)
	require.NoError(t, os.Mkdir("tmp", 0o755))
	t.Setenv("TMPDIR", "tmp")

	c, err := Start(t.Context(), Options{Logf: t.Logf})
	require.NoError(t, err)
	require.NoError(t, c.Stop())
}

// TestStartLongTMPDIR: a TMPDIR too long for a Unix socket path (107 bytes) must not
// stop the cluster, which is reached over TCP.
// Not parallel: it sets TMPDIR.
func TestStartLongTMPDIR(t *testing.T) {
	base := t.TempDir()
	long := filepath.Join(base, strings.Repeat("d", max(1, 100-len(base))))
	require.NoError(t, os.MkdirAll(long, 0o755))
	reachable(t, base)
	t.Setenv("TMPDIR", long)

	c, err := Start(t.Context(), Options{Logf: t.Logf})
	require.NoError(t, err)
	require.NoError(t, c.Stop())
}

// reachable opens dir, and the directories t.TempDir made above it, to the postgres
// user, so that a root test process does not fall back to /tmp.
func reachable(t *testing.T, dir string) {
	t.Helper()
	for d := dir; strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
}

// TestStartCanceled: a start stopped from outside (Ctrl-C in `outboxd demo`, a
// deadline) says why, rather than with the output of the step it cut short, and leaves
// nothing behind.
func TestStartCanceled(t *testing.T) {
	t.Parallel()
	interrupted := errors.New("interrupt signal received")
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	var dir string
	c, err := Start(ctx, Options{Logf: func(format string, args ...any) {
		if strings.HasPrefix(format, "pgcluster: initdb in ") {
			dir = filepath.Dir(args[0].(string))
			cancel(interrupted)
		}
	}})
	require.ErrorIs(t, err, interrupted)
	require.Nil(t, c)
	require.NotEmpty(t, dir)
	require.NoDirExists(t, dir)
}

// TestStartCanceledWhileTheServerStarts: a start stopped from outside once postgres runs
// and is not ready yet (Ctrl-C in `outboxd demo` a moment after initdb) says why, as one
// stopped during initdb does, rather than with the server log of a start that did not
// fail, and leaves nothing behind.
func TestStartCanceledWhileTheServerStarts(t *testing.T) {
	t.Parallel()
	interrupted := errors.New("interrupt signal received")
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	var dir string
	c, err := Start(ctx, Options{Logf: func(format string, args ...any) {
		if strings.HasPrefix(format, "pgcluster: initdb in ") {
			dir = filepath.Dir(args[0].(string))
		}
		if strings.HasPrefix(format, "pgcluster: starting postgres on ") {
			cancel(interrupted)
		}
	}})
	require.ErrorIs(t, err, interrupted)
	require.Equal(t, "start postgres: interrupt signal received", err.Error())
	require.Nil(t, c)
	require.NotEmpty(t, dir)
	require.NoDirExists(t, dir)
}

// ClearClientEnvironment leaves no variable libpq (and pgx) would read, and the others
// alone.
func TestClearClientEnvironment(t *testing.T) {
	t.Setenv("PGOPTIONS", "-c default_transaction_read_only=on")
	t.Setenv("PGSERVICE", "no_such_service")
	t.Setenv("OUTBOXD_TEST_KEPT", "kept")
	ClearClientEnvironment()
	for _, kv := range os.Environ() {
		require.False(t, strings.HasPrefix(kv, "PG"), "left: %s", kv)
	}
	require.Equal(t, "kept", os.Getenv("OUTBOXD_TEST_KEPT"))
}
