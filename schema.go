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
// [ErrSchemaTooNew]. Rows are never dropped: every schema change is additive.
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
