package pgtest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// execQuerier is what a pool, a transaction and a connection share.
type execQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func insertIntent(t *testing.T, db execQuerier, key string) {
	t.Helper()
	_, err := db.Exec(t.Context(),
		`INSERT INTO outbox (idempotency_key, connector, payload) VALUES ($1, 'webhook', '{}')`, key)
	require.NoError(t, err)
}

func countIntents(t *testing.T, db execQuerier, key string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(t.Context(),
		`SELECT count(*) FROM outbox WHERE idempotency_key = $1`, key).Scan(&n))
	return n
}

func requireSchema(t *testing.T, db execQuerier) {
	t.Helper()
	var table *string
	require.NoError(t, db.QueryRow(t.Context(), `SELECT to_regclass('outbox')::text`).Scan(&table))
	require.NotNil(t, table, "table outbox exists")
}

func TestDB(t *testing.T) {
	t.Parallel()

	t.Run("SchemaPresent", func(t *testing.T) {
		t.Parallel()
		requireSchema(t, pgtest.DB(t))
	})

	t.Run("Isolated", func(t *testing.T) {
		t.Parallel()
		a, b := pgtest.DB(t), pgtest.DB(t)
		insertIntent(t, a, "only-in-a")
		require.Equal(t, 1, countIntents(t, a, "only-in-a"))
		require.Equal(t, 0, countIntents(t, b, "only-in-a"))
	})

	t.Run("Parallel", func(t *testing.T) {
		t.Parallel()
		for i := range 8 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				pool := pgtest.DB(t)
				// The same key in every database: each would collide with the others'
				// if they shared one.
				insertIntent(t, pool, "same-key")
				require.Equal(t, 1, countIntents(t, pool, "same-key"))
			})
		}
	})

	t.Run("DroppedAtCleanup", func(t *testing.T) {
		t.Parallel()
		admin := pgtest.DB(t)
		var name string
		t.Run("Inner", func(t *testing.T) {
			require.NoError(t, pgtest.DB(t).QueryRow(t.Context(), `SELECT current_database()`).Scan(&name))
		})
		var exists bool
		require.NoError(t, admin.QueryRow(t.Context(),
			`SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists))
		require.False(t, exists, "database %s dropped", name)
	})
}

func TestURL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	requireSchema(t, conn)
}

func TestTx(t *testing.T) {
	t.Parallel()

	t.Run("SchemaPresent", func(t *testing.T) {
		t.Parallel()
		requireSchema(t, pgtest.Tx(t))
	})

	t.Run("RolledBack", func(t *testing.T) {
		t.Parallel()
		// Not parallel: the inner test, with its cleanup, is over when t.Run returns.
		t.Run("Insert", func(t *testing.T) {
			tx := pgtest.Tx(t)
			insertIntent(t, tx, "rolled-back")
			require.Equal(t, 1, countIntents(t, tx, "rolled-back"))
		})
		require.Equal(t, 0, countIntents(t, pgtest.Tx(t), "rolled-back"))
	})

	t.Run("Parallel", func(t *testing.T) {
		t.Parallel()
		for i := range 8 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				tx := pgtest.Tx(t)
				key := fmt.Sprintf("parallel-%d", i)
				insertIntent(t, tx, key)
				require.Equal(t, 1, countIntents(t, tx, key))
			})
		}
	})
}

func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	c := pgtest.Cluster(t)
	require.NoError(t, c.Restart(ctx))
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	require.NoError(t, conn.Ping(ctx))
}
