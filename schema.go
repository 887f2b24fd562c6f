// Package outboxd holds the outbox schema and applies it to a database.
//
// Applications enqueue through package [github.com/outboxd/outboxd/outbox]; the relay
// lives in [github.com/outboxd/outboxd/relay]. This package only embeds schema.sql and
// migrates a database to it, for `outboxd migrate` and for applications that embed the
// relay and prefer to migrate at start.
package outboxd

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Schema is the text of schema.sql: the whole current schema, idempotent.
//
//go:embed schema.sql
var Schema string

// SchemaVersion is the version schema.sql records in outbox_schema_migrations.
const SchemaVersion = 6

// ErrSchemaTooNew is returned by [Migrate] when the database was migrated by a newer
// outboxd than this one: applying an older schema could undo its changes.
var ErrSchemaTooNew = errors.New("database schema is newer than this outboxd")

// ErrInstallationHidden is returned by [Migrate] when the schema it would create the
// tables in (the first of the search_path) has none, while the search_path finds the
// outbox table in a later schema: a new installation would hide that one.
var ErrInstallationHidden = errors.New("a new outbox installation would hide the one the search_path finds")

// ErrDatabaseNotUTF8 is returned by [Migrate] when it would install outboxd in a
// database whose encoding is not UTF8.
var ErrDatabaseNotUTF8 = errors.New("the database's encoding is not UTF8")

// Beginner starts a transaction; [pgx.Conn], [pgxpool.Pool] and [pgx.Tx] satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// txOptionsBeginner starts a transaction with options; [pgx.Conn] and [pgxpool.Pool]
// satisfy it, [pgx.Tx] does not.
type txOptionsBeginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// migrateLockID is the advisory lock that serialises concurrent migrations
// (several relays starting at once). The number is arbitrary but fixed.
const migrateLockID = 7_345_120_001

// Migrate brings the database to [SchemaVersion] by applying [Schema] in one transaction,
// under an advisory lock so that concurrent callers apply it once. A database already at
// the current version is left alone; one at a newer version is refused with
// [ErrSchemaTooNew]. Rows are never dropped: every schema change is additive. It creates
// nothing, and the error wraps [ErrInstallationHidden], where the schema it creates the
// tables in has no outbox but the search_path finds one in a later schema; nor, with
// [ErrDatabaseNotUTF8], in a database whose encoding is not UTF8.
//
// It returns the version the database had before (0 for an empty database).
//
// Its own transaction is READ COMMITTED whatever the server's default isolation, so that
// a migration that waited on the lock sees what the one before it committed. Given a
// [pgx.Tx], it runs in that transaction's isolation.
func Migrate(ctx context.Context, db Beginner) (from int, err error) {
	migrate := func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLockID)); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		from, err = versionWhereCreated(ctx, tx)
		if err != nil {
			return err
		}
		if from > SchemaVersion {
			return fmt.Errorf("%w: database is at version %d, this outboxd knows version %d; upgrade outboxd",
				ErrSchemaTooNew, from, SchemaVersion)
		}
		if from == SchemaVersion {
			return nil
		}
		if from == 0 {
			if err := refuseToHide(ctx, tx); err != nil {
				return err
			}
			if err := refuseEncoding(ctx, tx); err != nil {
				return err
			}
		}
		// Exec without arguments uses the simple protocol, which runs a multi-statement script.
		if _, err := tx.Exec(ctx, Schema); err != nil {
			return fmt.Errorf("apply schema version %d: %w", SchemaVersion, err)
		}
		return nil
	}
	if b, ok := db.(txOptionsBeginner); ok {
		// Not the default isolation: under REPEATABLE READ or SERIALIZABLE (ALTER DATABASE
		// ... SET default_transaction_isolation) the snapshot is taken before the lock is
		// granted, and the second of two migrations would miss the first's tables and
		// version and fail on them.
		err = pgx.BeginTxFunc(ctx, b, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, migrate)
	} else {
		err = pgx.BeginFunc(ctx, db, migrate)
	}
	return from, err
}

// visibleOutboxSQL names the schema where the session's search_path finds the outbox
// table, when that is not the schema schema.sql creates its tables in (current_schema()),
// with both (quoted where SQL needs it) and the search_path for the error; no row
// otherwise. current_schemas leaves out the schemas the session may not use, as the
// search_path does.
const visibleOutboxSQL = `
SELECT quote_ident(f.s), quote_ident(current_schema()), current_setting('search_path')
FROM (SELECT p.s FROM unnest(current_schemas(false)) WITH ORDINALITY AS p(s, i)
      WHERE to_regclass(quote_ident(p.s) || '.outbox') IS NOT NULL
      ORDER BY p.i LIMIT 1) AS f
WHERE f.s <> current_schema()`

// refuseToHide returns an error wrapping [ErrInstallationHidden] when the schema that
// schema.sql creates its tables in has no outbox table but the search_path finds one in
// a later schema. Creating a second installation there would silently move every
// session on that search_path to it, empty: the relays and the operator commands would
// no longer see the rows of the other (pending, held, dead), Enqueue would take a key
// the other holds for a new intent (a second effect at the receiver), and sessions whose
// statements were prepared before would go on writing to the other. This is what an
// upgrade looked like with a search_path such as "app, public" and outboxd installed in
// public. Whoever wants a second installation there says so with a search_path that
// names that schema alone.
func refuseToHide(ctx context.Context, db Queryer) error {
	var found, target, path string
	err := db.QueryRow(ctx, visibleOutboxSQL).Scan(&found, &target, &path)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look for the outbox table on the search_path: %w", err)
	}
	return fmt.Errorf("%w: the search_path (%s) finds the outbox table in schema %s, but the tables would be created in %s, "+
		"its first schema, which has none: that new, empty installation would hide %s's rows from every session with this search_path. "+
		"To upgrade the installation in %s, migrate with search_path=%s (in OUTBOX_DATABASE_URL); to install outboxd in %s beside it, "+
		"migrate with search_path=%s alone",
		ErrInstallationHidden, path, found, target, found, found, found, target, target)
}

// refuseEncoding returns an error wrapping [ErrDatabaseNotUTF8] when the database's
// encoding is not UTF8. In SQL_ASCII (initdb's default under the C or POSIX locale) a key
// of 200 "é" is 400 characters to the table's length check, and jsonb refuses a \u
// escape of any character past ASCII, which JSON encoders write (json.Marshal for U+2028,
// Python's json.dumps for every one); in LATIN1 and the like, the characters the
// encoding lacks fail the same way. Messages the outbox package accepts would then fail
// at the INSERT and abort the caller's transaction. Only a new installation is refused:
// one that exists is upgraded as it is.
func refuseEncoding(ctx context.Context, db Queryer) error {
	var enc string
	if err := db.QueryRow(ctx, `SELECT current_setting('server_encoding')`).Scan(&enc); err != nil {
		return fmt.Errorf("read the database's encoding: %w", err)
	}
	if enc == "UTF8" {
		return nil
	}
	return fmt.Errorf("%w: it is %s, in which keys and payloads that outboxd accepts (characters past ASCII, \\u escapes of them) "+
		"fail at the INSERT and abort the caller's transaction; install outboxd in a database created with "+
		"ENCODING 'UTF8' (CREATE DATABASE name ENCODING 'UTF8' TEMPLATE template0, or initdb --encoding=UTF8)",
		ErrDatabaseNotUTF8, enc)
}

// Queryer runs a query returning one row; [pgx.Conn], [pgxpool.Pool] and [pgx.Tx]
// satisfy it.
type Queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AppliedVersion returns the newest schema version applied to the database, 0 when it
// has none (outbox_schema_migrations does not exist). It never aborts a transaction it
// runs in: the table is looked up before it is read.
func AppliedVersion(ctx context.Context, db Queryer) (int, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('outbox_schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM outbox_schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// versionWhereCreated returns the version recorded in the schema where [Schema] creates its
// tables (the first schema of the search_path that exists, current_schema()), 0 when that
// schema has no outbox_schema_migrations. [AppliedVersion] finds the table anywhere on the
// search_path: an installation in a schema later on the path (public) would make Migrate
// report a new schema current and create nothing there, where schema.sql creates it.
func versionWhereCreated(ctx context.Context, db Queryer) (int, error) {
	var schema *string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if schema == nil {
		return 0, nil // no schema to create in: applying the schema will say so
	}
	table := pgx.Identifier{*schema, "outbox_schema_migrations"}.Sanitize()
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+table).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}
