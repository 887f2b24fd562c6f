package outboxd_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// oldDB returns a fresh database holding the schema of an older version (testdata),
// in place of the current one the template has.
func oldDB(t testing.TB, version int) *pgxpool.Pool {
	t.Helper()
	return oldDBFrom(t, fmt.Sprintf("testdata/schema_v%d.sql", version), version)
}

// oldDBFrom is oldDB with the older schema read from file, which records version.
func oldDBFrom(t testing.TB, file string, version int) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.DB(t)
	old, err := os.ReadFile(file)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `
		DROP TABLE outbox_audit, outbox_attempts, outbox_wake_connectors, outbox_wake, outbox, outbox_schema_migrations CASCADE;
		DROP FUNCTION outbox_notify(), outbox_delete_attempts()`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), string(old))
	require.NoError(t, err)
	v, err := outboxd.AppliedVersion(t.Context(), pool)
	require.NoError(t, err)
	require.Equal(t, version, v)
	return pool
}

// fillEveryStatus writes rows in every status, with ordering keys, leases, attempts and
// audit rows, as relays and operators of an older version left them.
const fillEveryStatus = `
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, ordering_key, lease_owner,
                    lease_expires_at, ambiguous, last_error, result, headers, created_by, first_attempt_at,
                    next_attempt_at, delivered_at)
VALUES ('pending-1', 'webhook', '{"n": 1}', 'pending', 0, NULL, NULL, NULL, false, NULL, NULL, '{}', 'app', NULL, now(), NULL),
       ('retry-1', 'webhook', '{"n": 2}', 'pending', 2, 'k', NULL, NULL, true, 'timeout', NULL, '{"traceparent": "00-x"}', NULL, now() - interval '1 minute', now() + interval '1 hour', NULL),
       ('flight-1', 'webhook', '{"n": 3}', 'delivering', 1, 'k2', 'old-relay', now() + interval '1 hour', false, NULL, NULL, '{}', NULL, now(), now(), NULL),
       ('lost-1', 'webhook', '{"n": 4}', 'delivering', 1, NULL, 'ghost', now() - interval '1 minute', false, NULL, NULL, '{}', NULL, now() - interval '2 minutes', now(), NULL),
       ('done-1', 'webhook', '{"n": 5}', 'delivered', 1, 'k3', NULL, NULL, false, NULL, '{"ok": true}', '{}', NULL, now(), now(), now()),
       ('dead-1', 'webhook', '{"n": 6}', 'dead', 5, 'k4', NULL, NULL, false, '422', NULL, '{}', NULL, now(), now(), NULL),
       ('gone-1', 'webhook', '{"n": 7}', 'canceled', 0, NULL, NULL, NULL, false, NULL, NULL, '{}', NULL, NULL, now(), NULL),
       ('wait-1', 'email', '{"to": "a@b"}', 'awaiting_approval', 0, NULL, NULL, NULL, false, NULL, NULL, '{}', NULL, NULL, now(), NULL),
       ('held-1', 'payment', '{"amount": 1}', 'held', 1, 'k5', NULL, NULL, true, 'held for an operator', NULL, '{}', NULL, now(), now(), NULL),
       ('k4-next', 'webhook', '{"n": 8}', 'pending', 0, 'k4', NULL, NULL, false, NULL, NULL, '{}', NULL, NULL, now(), NULL);
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
SELECT id, g, 'old-relay', now() - interval '1 minute', now(), CASE WHEN g = attempts THEN
           CASE status WHEN 'delivered' THEN 'delivered' WHEN 'dead' THEN 'dead' WHEN 'held' THEN 'held' ELSE 'retry' END
       ELSE 'retry' END, ambiguous AND g = attempts, last_error
FROM outbox, generate_series(1, attempts) g
WHERE status <> 'delivering';
INSERT INTO outbox_audit (outbox_id, action, actor, reason, details)
SELECT id, a, 'op', 'because', '{"x": 1}'
FROM outbox, (VALUES ('replay'), ('cancel'), ('approve')) v(a)
WHERE idempotency_key IN ('dead-1', 'gone-1', 'wait-1');
`

// snapshot returns every row of the outbox tables, as text, in id order.
func snapshot(t *testing.T, db *pgxpool.Pool) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, table := range []string{"outbox", "outbox_attempts", "outbox_audit", "outbox_wake"} {
		rows, err := db.Query(t.Context(), fmt.Sprintf(`SELECT row_to_json(x)::text FROM %s x ORDER BY 1`, table))
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		out[table] = got
	}
	return out
}

// catalog describes the outbox schema's indexes (with validity), constraints,
// triggers, table options and functions, as PostgreSQL prints them.
func catalog(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	rows, err := db.Query(t.Context(), `
		SELECT 'index ' || pg_get_indexdef(i.indexrelid) || ' valid=' || i.indisvalid
		FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
		WHERE c.relname LIKE 'outbox%' AND c.relnamespace = 'public'::regnamespace
		UNION ALL
		SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE connamespace = 'public'::regnamespace
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(oid) || ' enabled=' || tgenabled::text
		FROM pg_trigger WHERE NOT tgisinternal
		UNION ALL
		SELECT 'options ' || relname || ' ' || coalesce(reloptions::text, '')
		FROM pg_class WHERE relname LIKE 'outbox%' AND relkind = 'r' AND relnamespace = 'public'::regnamespace
		UNION ALL
		SELECT 'function ' || pg_get_functiondef(p.oid)
		FROM pg_proc p WHERE p.proname LIKE 'outbox%' AND p.pronamespace = 'public'::regnamespace`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	sort.Strings(got)
	return got
}

// A database at every older version, holding rows in every status, moves to the current
// version with every row, attempt and audit row as it was, and with the same indexes,
// constraints, triggers and options as a database created at the current version.
func TestUpgradeKeepsEveryRowAndMatchesAFreshSchema(t *testing.T) {
	t.Parallel()
	want := catalog(t, pgtest.DB(t))
	for version := 1; version < outboxd.SchemaVersion; version++ {
		t.Run(fmt.Sprintf("version %d", version), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := oldDB(t, version)
			_, err := db.Exec(ctx, fillEveryStatus)
			require.NoError(t, err)
			before := snapshot(t, db)
			require.Len(t, before["outbox"], 10)
			require.Len(t, before["outbox_attempts"], 9)
			require.Len(t, before["outbox_audit"], 9)

			from, err := outboxd.Migrate(ctx, db)
			require.NoError(t, err)
			require.Equal(t, version, from)
			v, err := outboxd.AppliedVersion(ctx, db)
			require.NoError(t, err)
			require.Equal(t, outboxd.SchemaVersion, v)

			require.Equal(t, before, snapshot(t, db), "every row as it was")
			require.Equal(t, want, catalog(t, db), "the same schema as a fresh database")

			// The new partial index holds the rows in flight that were there before.
			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			_, err = tx.Exec(ctx, `SET LOCAL enable_seqscan = off`)
			require.NoError(t, err)
			var inFlight []string
			require.NoError(t, tx.QueryRow(ctx, `SELECT array_agg(idempotency_key ORDER BY id) FROM outbox
				WHERE ordering_key IS NOT NULL AND status = 'delivering'`).Scan(&inFlight))
			require.Equal(t, []string{"flight-1"}, inFlight)
		})
	}
}

// relationLocks returns the table locks that backend pid holds on the outbox tables.
func relationLocks(t *testing.T, db *pgxpool.Pool, pid uint32) []string {
	t.Helper()
	rows, err := db.Query(t.Context(), `
		SELECT relation::regclass::text || ' ' || mode FROM pg_locks
		WHERE pid = $1 AND locktype = 'relation' AND granted
		  AND relation::regclass::text IN ('outbox', 'outbox_attempts', 'outbox_audit', 'outbox_wake', 'outbox_schema_migrations')
		ORDER BY 1`, pid)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// locksOf runs apply in a transaction of its own and returns the table locks it holds at
// the end, which it would hold until it commits.
func locksOf(t *testing.T, db *pgxpool.Pool, apply func(tx pgx.Tx) error) []string {
	t.Helper()
	ctx := t.Context()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var pid uint32
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	require.NoError(t, apply(tx))
	return relationLocks(t, db, pid)
}

// heavy returns the locks on table that stop its writers for longer than an index
// build needs or its readers too: ACCESS EXCLUSIVE (DROP TRIGGER, DROP CONSTRAINT),
// EXCLUSIVE and SHARE ROW EXCLUSIVE (CREATE TRIGGER). SHARE (CREATE INDEX) is allowed.
func heavy(locks []string, table string) []string {
	var out []string
	for _, l := range locks {
		for _, mode := range []string{"AccessExclusiveLock", "ExclusiveLock", "ShareRowExclusiveLock"} {
			if l == table+" "+mode {
				out = append(out, l)
			}
		}
	}
	return out
}

// Upgrading a running system takes no lock that stops reads of outbox or outbox_attempts,
// nor one that holds writes for longer than building the new index: the trigger and the
// old foreign key are already as the schema wants them, and are left alone. Applying
// schema.sql again to a current database (psql -f schema.sql) takes none either.
func TestUpgradeTakesNoExclusiveTableLock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		db    func(t testing.TB) *pgxpool.Pool
		apply func(ctx context.Context, tx pgx.Tx) error
	}{
		{"Migrate from version 3", func(t testing.TB) *pgxpool.Pool { return oldDB(t, 3) }, migrateFrom(3)},
		{"Migrate from version 4", func(t testing.TB) *pgxpool.Pool { return oldDB(t, 4) }, migrateFrom(4)},
		{"Migrate from version 5", func(t testing.TB) *pgxpool.Pool { return oldDB(t, 5) }, migrateFrom(5)},
		{"schema.sql again at the current version", pgtest.DB,
			func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, outboxd.Schema)
				return err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			locks := locksOf(t, tc.db(t), func(tx pgx.Tx) error { return tc.apply(t.Context(), tx) })
			require.Empty(t, heavy(locks, "outbox"), "all locks: %v", locks)
			require.Empty(t, heavy(locks, "outbox_attempts"), "all locks: %v", locks)
		})
	}
	t.Run("Migrate at the current version", func(t *testing.T) {
		t.Parallel()
		db := pgtest.DB(t)
		locks := locksOf(t, db, func(tx pgx.Tx) error {
			_, err := outboxd.Migrate(t.Context(), tx)
			return err
		})
		require.Equal(t, []string{"outbox_schema_migrations AccessShareLock"}, locks, "a no-op reads the version only")
	})
}

// migrateFrom migrates tx's database, which must be at version from.
func migrateFrom(from int) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		was, err := outboxd.Migrate(ctx, tx)
		if err == nil && was != from {
			return fmt.Errorf("migrated from %d", was)
		}
		return err
	}
}

// A version 1 database (its attempts' foreign key) and a version 2 one still come
// forward, and their delete trigger works, with the guarded statements.
func TestUpgradeFromVersion1ReplacesTheForeignKey(t *testing.T) {
	t.Parallel()
	db := oldDB(t, 1)
	_, err := db.Exec(t.Context(), fillEveryStatus)
	require.NoError(t, err)
	_, err = outboxd.Migrate(t.Context(), db)
	require.NoError(t, err)
	_, err = db.Exec(t.Context(), `DELETE FROM outbox WHERE idempotency_key = 'dead-1'`)
	require.NoError(t, err)
	var n int
	require.NoError(t, db.QueryRow(t.Context(), `SELECT count(*) FROM outbox_attempts a WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = a.outbox_id)`).Scan(&n))
	require.Zero(t, n)
}

// Two migrations from version 3 at once: one applies the schema, the other waits for it
// on the advisory lock and then finds nothing to do.
func TestTwoMigrationsAtOnceFromVersion3(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := oldDB(t, 3)
	migrate := func() (int, error) { return outboxd.Migrate(ctx, db) }
	require.Equal(t, []int{3, outboxd.SchemaVersion}, twoMigrationsAtOnce(t, db, migrate, migrate))
	var rows int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox_schema_migrations WHERE version = $1`, outboxd.SchemaVersion).Scan(&rows))
	require.Equal(t, 1, rows)
}

// Two migrations at once where the server's default isolation is serializable (ALTER
// DATABASE ... SET default_transaction_isolation): the second, whose snapshot was taken
// before it waited on the advisory lock, did not see the first's work and failed with a
// serialization failure instead of finding nothing to do.
func TestTwoMigrationsAtOnceUnderSerializableDefault(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := oldDB(t, 3)
	var migrate [2]func() (int, error)
	for i := range migrate {
		cfg := db.Config().ConnConfig.Copy()
		cfg.RuntimeParams["default_transaction_isolation"] = "serializable"
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
		migrate[i] = func() (int, error) { return outboxd.Migrate(ctx, conn) }
	}
	require.Equal(t, []int{3, outboxd.SchemaVersion}, twoMigrationsAtOnce(t, db, migrate[0], migrate[1]))
}

// twoMigrationsAtOnce runs a and b while db's advisory lock of Migrate is held, lets
// them go once both wait on it, and returns the versions they migrated from, in order.
func twoMigrationsAtOnce(t *testing.T, db *pgxpool.Pool, a, b func() (int, error)) []int {
	t.Helper()
	ctx := t.Context()
	holder, err := db.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	const lockID = 7_345_120_001 // schema.go's migrateLockID
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(lockID))
	require.NoError(t, err)

	type result struct {
		from int
		err  error
	}
	results := make(chan result, 2)
	for _, migrate := range []func() (int, error){a, b} {
		go func() {
			from, err := migrate()
			results <- result{from, err}
		}()
	}
	// Both wait on the lock before either may go. pg_locks covers the whole cluster, where
	// other tests' migrations (TestMigrateConcurrently) wait on the same lock id in their
	// own databases: only this database's waiters count.
	require.Eventually(t, func() bool {
		var waiting int
		err := db.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting)
		return err == nil && waiting == 2
	}, time.Minute, 5*time.Millisecond)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(lockID))
	require.NoError(t, err)

	var froms []int
	for range 2 {
		r := <-results
		require.NoError(t, r.err)
		froms = append(froms, r.from)
	}
	sort.Ints(froms)
	return froms
}

// AppliedVersion and Migrate at the edges: an empty migrations table, none at all, and
// versions with gaps.
func TestAppliedVersionEdges(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, sql string
		applied   int
		migrate   error
	}{
		{"empty table", `DELETE FROM outbox_schema_migrations`, 0, nil},
		{"no table", `DROP TABLE outbox_schema_migrations`, 0, nil},
		{"gaps", `DELETE FROM outbox_schema_migrations; INSERT INTO outbox_schema_migrations (version) VALUES (1), (3)`, 3, nil},
		{"gap above", `INSERT INTO outbox_schema_migrations (version) VALUES (1), (7)`, 7, outboxd.ErrSchemaTooNew},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := pgtest.DB(t)
			_, err := db.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('keep', 'webhook', '{}')`)
			require.NoError(t, err)
			_, err = db.Exec(ctx, tt.sql)
			require.NoError(t, err)
			v, err := outboxd.AppliedVersion(ctx, db)
			require.NoError(t, err)
			require.Equal(t, tt.applied, v)
			from, err := outboxd.Migrate(ctx, db)
			if tt.migrate != nil {
				require.ErrorIs(t, err, tt.migrate)
				v, err = outboxd.AppliedVersion(ctx, db)
				require.NoError(t, err)
				require.Equal(t, tt.applied, v, "a refused migration changes nothing")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.applied, from)
			v, err = outboxd.AppliedVersion(ctx, db)
			require.NoError(t, err)
			require.Equal(t, outboxd.SchemaVersion, v)
			var n int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE idempotency_key = 'keep'`).Scan(&n))
			require.Equal(t, 1, n)
		})
	}
}

// A database at an older version holds only that version's tables: an upgrade test
// that starts with a later version's table already there (oldDB used to leave
// outbox_wake_connectors, from the current template, in its version 4 database) checks
// nothing about the migration creating it.
func TestOldDBHasNoLaterTables(t *testing.T) {
	t.Parallel()
	for version := 1; version < 5; version++ { // outbox_wake_connectors came with version 5
		db := oldDB(t, version)
		var exists bool
		require.NoError(t, db.QueryRow(t.Context(), `SELECT to_regclass('outbox_wake_connectors') IS NOT NULL`).Scan(&exists))
		require.False(t, exists, "version %d has no outbox_wake_connectors", version)
	}
}

// The step from version 4 builds no index, so it takes no lock that stops writers of
// outbox or outbox_attempts either: an insert and a relay's recorded attempt go on while
// the migration's transaction is open. (CREATE INDEX IF NOT EXISTS took a SHARE lock on
// the table before finding its index there, held until the migration committed.)
func TestUpgradeFromVersion4LetsWritersGoOn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := oldDB(t, 4)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	require.NoError(t, migrateFrom(4)(ctx, tx))
	conn, err := db.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET lock_timeout = '2s'`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `RESET lock_timeout`) }()
	_, err = conn.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('w-1', 'webhook', '{}')`)
	require.NoError(t, err, "an insert into outbox waited for the migration")
	_, err = conn.Exec(ctx, `INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, outcome)
		VALUES (1, 1, 'r', now(), 'retry')`)
	require.NoError(t, err, "a recorded attempt waited for the migration")
}

// columns describes the outbox tables' columns (name, type, NOT NULL, default), sorted:
// a column added to an existing table comes last, where a fresh table has it in place.
func columns(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	rows, err := db.Query(t.Context(), `
		SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		       || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
		       || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE c.relname LIKE 'outbox%' AND c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
		  AND a.attnum > 0 AND NOT a.attisdropped`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	sort.Strings(got)
	return got
}

// Version 1 was written in several shapes, each recorded as version 1, and the first
// ones (schema.sql of commit c8fa33c and before, with the relay and outboxd migrate) had
// no first_attempt_at, which CREATE TABLE IF NOT EXISTS does not add: migrate said the
// database was at the current version, and every claim and reclaim of the relay failed
// on the missing column, its rows pending for good. The column is added, and a row
// attempted before gets the start of its earliest logged attempt, so that a receiver's
// key window counts from there and not from the next attempt.
func TestUpgradeFromTheFirstShapeOfVersion1AddsFirstAttemptAt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	fresh := pgtest.DB(t)
	db := oldDBFrom(t, "testdata/schema_v1_before_first_attempt_at.sql", 1)
	_, err := db.Exec(ctx, `
		INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, created_at)
		VALUES ('new', 'webhook', '{}', 'pending', 0, '2026-11-29 11:00Z'),
		       ('retried', 'payment', '{}', 'pending', 2, '2026-11-29 11:00Z'),
		       ('unlogged', 'webhook', '{}', 'dead', 1, '2026-11-29 11:30Z');
		INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome)
		SELECT id, g, 'old-relay', timestamptz '2026-11-29 12:00Z' + g * interval '1 hour', now(), 'retry'
		FROM outbox, generate_series(1, 2) g WHERE idempotency_key = 'retried'`)
	require.NoError(t, err)

	from, err := outboxd.Migrate(ctx, db)
	require.NoError(t, err)
	require.Equal(t, 1, from)
	require.Equal(t, columns(t, fresh), columns(t, db), "the columns of a fresh database")
	require.Equal(t, catalog(t, fresh), catalog(t, db), "the same schema as a fresh database")

	rows, err := db.Query(ctx, `SELECT idempotency_key || ' ' || coalesce(to_char(first_attempt_at AT TIME ZONE 'UTC', 'HH24:MI'), '-')
		FROM outbox ORDER BY id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"new -", "retried 13:00", "unlogged 11:30"}, got,
		"the earliest logged attempt, else the row's creation; none for a row never attempted")
}
