package outboxd_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// connWithSearchPath opens one connection to pool's database with the given search_path.
func connWithSearchPath(t *testing.T, pool *pgxpool.Pool, searchPath string) *pgx.Conn {
	t.Helper()
	cfg := pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["search_path"] = searchPath
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(t.Context())) })
	return conn
}

// indexNames lists the indexes of the outbox tables in schema.
func indexNames(t *testing.T, db outboxd.Queryer, schema string) []string {
	t.Helper()
	var names []string
	require.NoError(t, db.QueryRow(t.Context(), `SELECT coalesce(array_agg(indexname::text ORDER BY indexname), '{}')
		FROM pg_indexes WHERE schemaname = $1 AND tablename LIKE 'outbox%'`, schema).Scan(&names))
	return names
}

// The schema applied where the tables live, in a schema other than public, creates that
// schema's indexes even when an index of the same name lives in a schema later on the
// search_path (another outboxd installation in public), as CREATE INDEX IF NOT EXISTS did:
// it looks for the name in its table's schema only.
func TestIndexesCreatedInTheTablesSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t) // migrated: public holds the current schema and its indexes
	want := indexNames(t, pool, "public")

	t.Run("empty schema, schema.sql applied", func(t *testing.T) {
		_, err := pool.Exec(ctx, `CREATE SCHEMA app1`)
		require.NoError(t, err)
		conn := connWithSearchPath(t, pool, "app1, public")
		_, err = conn.Exec(ctx, outboxd.Schema)
		require.NoError(t, err)
		require.Equal(t, want, indexNames(t, pool, "app1"))
	})
	t.Run("Migrate from version 3", func(t *testing.T) {
		_, err := pool.Exec(ctx, `CREATE SCHEMA app2`)
		require.NoError(t, err)
		conn := connWithSearchPath(t, pool, "app2, public")
		old, err := os.ReadFile("testdata/schema_v3.sql")
		require.NoError(t, err)
		_, err = conn.Exec(ctx, string(old))
		require.NoError(t, err)
		from, err := outboxd.Migrate(ctx, conn)
		require.NoError(t, err)
		require.Equal(t, 3, from)
		require.Equal(t, want, indexNames(t, pool, "app2"))
	})
}

// A temporary table of the session that migrates, named as one of the indexes, does not
// stop that index from being created (pg_temp comes first on every search_path).
func TestIndexesCreatedDespiteTempTableOfTheSameName(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	want := indexNames(t, pool, "public")
	_, err := pool.Exec(ctx, `
		DROP TABLE outbox_audit, outbox_attempts, outbox_wake_connectors, outbox_wake, outbox, outbox_schema_migrations CASCADE;
		DROP FUNCTION outbox_notify(), outbox_delete_attempts()`)
	require.NoError(t, err)
	conn := connWithSearchPath(t, pool, "public")
	_, err = conn.Exec(ctx, `CREATE TEMP TABLE outbox_pending_due (x int)`)
	require.NoError(t, err)
	_, err = outboxd.Migrate(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, want, indexNames(t, pool, "public"))
}
