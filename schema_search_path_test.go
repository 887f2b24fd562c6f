package outboxd_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// The trigger functions named outbox_attempts and outbox_wake_connectors without a
// schema, so they resolved them along the search_path of whoever deleted or inserted,
// not in the schema of the outbox table that fired them (fixed in version 6). An operator (or retention
// script, or an application) whose search_path finds another installation first, here
// the one in public, deleting a row of the installation in schema app1 by its qualified
// name deleted the attempts of the row with the same id in public.
func TestDeleteInOneSchemaKeepsAnotherInstallationsAttempts(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t) // public holds a current installation
	_, err := pool.Exec(ctx, `CREATE SCHEMA app1`)
	require.NoError(t, err)
	inApp1 := connWithSearchPath(t, pool, "app1")
	_, err = outboxd.Migrate(ctx, inApp1)
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'app1' AND tablename = 'outbox_attempts'`).Scan(&n))
	require.Equal(t, 1, n, "app1 has its own installation")

	// The same row id, with one attempt, in each installation.
	for _, s := range []string{"public", "app1"} {
		_, err = pool.Exec(ctx, `INSERT INTO `+s+`.outbox (id, idempotency_key, connector, payload, status, attempts)
			VALUES (1, 'k', 'webhook', '{}', 'dead', 1)`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO `+s+`.outbox_attempts (outbox_id, attempt, relay_id, started_at, outcome)
			VALUES (1, 1, 'r', now(), 'dead')`)
		require.NoError(t, err)
	}

	// A session on the default search_path (public) deletes app1's row by its qualified name.
	_, err = pool.Exec(ctx, `DELETE FROM app1.outbox WHERE id = 1`)
	require.NoError(t, err)

	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM public.outbox_attempts WHERE outbox_id = 1`).Scan(&n))
	require.Equal(t, 1, n, "public's row 1 is still there, so are its attempts")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM app1.outbox_attempts WHERE outbox_id = 1`).Scan(&n))
	require.Zero(t, n, "app1's deleted row's attempts go with it")
}

// An application that writes to an installation in its own schema by the qualified name
// (INSERT INTO app1.outbox ...), with a search_path that does not name that schema, could
// not enqueue at all: the insert trigger's function looked for outbox_wake_connectors on
// the inserting session's search_path.
func TestQualifiedInsertWithOtherSearchPath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := pool.Exec(ctx, `CREATE SCHEMA app1; CREATE SCHEMA shop`)
	require.NoError(t, err)
	_, err = outboxd.Migrate(ctx, connWithSearchPath(t, pool, "app1"))
	require.NoError(t, err)

	app := connWithSearchPath(t, pool, "shop")
	_, err = app.Exec(ctx, `INSERT INTO app1.outbox (idempotency_key, connector, payload) VALUES ('order-1', 'webhook', '{}')`)
	require.NoError(t, err, "a plain, qualified INSERT into the outbox must work")
}

// Migrate decided from outbox_schema_migrations found along the search_path, but
// schema.sql creates its tables in the first schema of the search_path. With an
// installation in public later on the path, Migrate into a new schema app1 reported the
// database current and created nothing, where psql -f schema.sql creates app1's. Now
// that path is refused, loudly (creating app1's would hide public's from every session
// on it: TestMigrateRefusesToHideAnInstallationLaterOnThePath), and a search_path that
// names app1 alone creates app1's.
func TestMigrateIntoNewSchemaBesidesAnotherInstallation(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := pool.Exec(ctx, `CREATE SCHEMA app1`)
	require.NoError(t, err)
	_, err = outboxd.Migrate(ctx, connWithSearchPath(t, pool, "app1, public"))
	require.ErrorIs(t, err, outboxd.ErrInstallationHidden, "not reported current")
	from, err := outboxd.Migrate(ctx, connWithSearchPath(t, pool, "app1"))
	require.NoError(t, err)
	require.Equal(t, 0, from, "app1 has no schema yet")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'app1'`).Scan(&n))
	require.NotZero(t, n, "Migrate created app1's tables")
	from, err = outboxd.Migrate(ctx, connWithSearchPath(t, pool, "app1, public"))
	require.NoError(t, err)
	require.Equal(t, outboxd.SchemaVersion, from, "app1's, first on the path, is current")
}

// Migrate into a schema whose name holds "$$", which PostgreSQL allows in a quoted
// identifier: the trigger functions' bodies were written between $$ with the schema's
// name inside, which ended the body there, and the migration failed with a syntax error.
func TestMigrateIntoSchemaWithDollarsInItsName(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := pool.Exec(ctx, `CREATE SCHEMA "app$$1"`)
	require.NoError(t, err)
	conn := connWithSearchPath(t, pool, `"app$$1"`)
	from, err := outboxd.Migrate(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, 0, from)

	// Its triggers work: an insert, and a delete that takes the row's attempts with it.
	_, err = conn.Exec(ctx, `INSERT INTO outbox (id, idempotency_key, connector, payload, status, attempts)
		VALUES (1, 'k', 'webhook', '{}', 'dead', 1)`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, outcome)
		VALUES (1, 1, 'r', now(), 'dead')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `DELETE FROM outbox WHERE id = 1`)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox_attempts`).Scan(&n))
	require.Zero(t, n, "the deleted row's attempts go with it")
}

// The upgrade README describes (outboxd migrate with the new binary first), run with a
// search_path that names the application's own schema before public, where an older
// outboxd installed the outbox: schema.sql creates its tables in the first schema, so
// Migrate created a second, empty installation in app, which hid public's from every
// session on that search_path. New sessions enqueued a key public already held as a new
// intent (a second effect at the receiver), public's pending and held rows were never
// delivered nor shown, and sessions with statements prepared before the migration went
// on writing to public. Migrate now refuses, names both schemas and creates nothing;
// migrated with search_path=public it upgrades public's installation.
func TestMigrateRefusesToHideAnInstallationLaterOnThePath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := oldDB(t, 5) // public holds a version 5 installation, with a row
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('order-1/charge', 'webhook', '{}');
		CREATE SCHEMA app; CREATE TABLE app.orders (id int)`)
	require.NoError(t, err)

	from, err := outboxd.Migrate(ctx, connWithSearchPath(t, pool, "app, public"))
	require.ErrorIs(t, err, outboxd.ErrInstallationHidden)
	require.ErrorContains(t, err, `the search_path (app, public) finds the outbox table in schema public, but the tables would be created in app`)
	require.ErrorContains(t, err, `search_path=public`)
	require.Zero(t, from)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'app' AND tablename LIKE 'outbox%'`).Scan(&n))
	require.Zero(t, n, "nothing created in app")

	from, err = outboxd.Migrate(ctx, connWithSearchPath(t, pool, "public"))
	require.NoError(t, err)
	require.Equal(t, 5, from, "public's installation upgraded")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM public.outbox WHERE idempotency_key = 'order-1/charge'`).Scan(&n))
	require.Equal(t, 1, n)
}
