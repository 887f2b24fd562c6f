package pgcluster

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
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
