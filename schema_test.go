package outboxd_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// emptySchemaConn returns a connection whose search_path is a new, empty schema, so the
// migration runs as on an empty database.
func emptySchemaConn(t *testing.T, pool *pgxpool.Pool) *pgxpool.Conn {
	t.Helper()
	conn, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	_, err = conn.Exec(t.Context(), `CREATE SCHEMA fresh; SET search_path = fresh`)
	require.NoError(t, err)
	return conn
}

func TestMigrateEmptyThenAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := emptySchemaConn(t, pgtest.DB(t))

	from, err := outboxd.Migrate(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, 0, from)

	_, err = conn.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('keep-me', 'webhook', '{}')`)
	require.NoError(t, err)

	from, err = outboxd.Migrate(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, outboxd.SchemaVersion, from)

	// The file itself applies again cleanly, and rows survive.
	_, err = conn.Exec(ctx, outboxd.Schema)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, outboxd.Schema)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE idempotency_key = 'keep-me'`).Scan(&n))
	require.Equal(t, 1, n)
}

// A database at an older version moves to the current one with its rows: the attempts'
// foreign key of version 1 gives way to the delete trigger, and new outbox pages leave
// half their room for updates.
func TestMigrateFromOlderVersions(t *testing.T) {
	t.Parallel()
	for _, version := range []int{1, 2} {
		t.Run(fmt.Sprintf("version %d", version), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			conn := emptySchemaConn(t, pgtest.DB(t))
			old, err := os.ReadFile(fmt.Sprintf("testdata/schema_v%d.sql", version))
			require.NoError(t, err)
			_, err = conn.Exec(ctx, string(old))
			require.NoError(t, err)
			_, err = conn.Exec(ctx, `
				INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('old', 'webhook', '{}'), ('other', 'webhook', '{}');
				INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, outcome)
				SELECT id, 1, 'r', now(), 'retry' FROM outbox`)
			require.NoError(t, err)

			from, err := outboxd.Migrate(ctx, conn)
			require.NoError(t, err)
			require.Equal(t, version, from)
			var now int
			require.NoError(t, conn.QueryRow(ctx, `SELECT max(version) FROM outbox_schema_migrations`).Scan(&now))
			require.Equal(t, outboxd.SchemaVersion, now)

			var fks int
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_constraint
				WHERE conrelid = 'outbox_attempts'::regclass AND contype = 'f'`).Scan(&fks))
			require.Zero(t, fks, "no foreign key checks on recording attempts")
			var options []string
			require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'outbox'::regclass`).Scan(&options))
			require.Equal(t, []string{"fillfactor=50"}, options)

			// Deleting a row still deletes its attempts, and only its own.
			_, err = conn.Exec(ctx, `DELETE FROM outbox WHERE idempotency_key = 'old'`)
			require.NoError(t, err)
			var left []string
			require.NoError(t, conn.QueryRow(ctx, `SELECT array_agg(o.idempotency_key) FROM outbox_attempts a JOIN outbox o ON o.id = a.outbox_id`).Scan(&left))
			require.Equal(t, []string{"other"}, left)
			var orphans int
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox_attempts a WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = a.outbox_id)`).Scan(&orphans))
			require.Zero(t, orphans)
		})
	}
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := pool.Exec(ctx, `CREATE SCHEMA fresh`)
	require.NoError(t, err)

	errs := make(chan error, 4)
	for range 4 {
		go func() {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, `SET search_path = fresh`); err != nil {
				errs <- err
				return
			}
			_, err = outboxd.Migrate(ctx, conn)
			_, _ = conn.Exec(context.WithoutCancel(ctx), `RESET search_path`)
			errs <- err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := pool.Exec(ctx, `INSERT INTO outbox_schema_migrations (version) VALUES (999)`)
	require.NoError(t, err)
	_, err = outboxd.Migrate(ctx, pool)
	require.ErrorIs(t, err, outboxd.ErrSchemaTooNew)
	require.Contains(t, err.Error(), "999")
}

func TestPlainInsertDefaults(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)

	_, err := tx.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('plain-1', 'webhook', '{"a": 1}')`)
	require.NoError(t, err)

	var (
		status            string
		attempts          int
		due, dbNow        time.Time
		headers           map[string]string
		leaseOwner        *string
		lastErr, ordering *string
	)
	require.NoError(t, tx.QueryRow(ctx, `SELECT status, attempts, next_attempt_at, now(), headers, lease_owner, last_error, ordering_key
		FROM outbox WHERE idempotency_key = 'plain-1'`).Scan(&status, &attempts, &due, &dbNow, &headers, &leaseOwner, &lastErr, &ordering))
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts)
	require.False(t, due.After(dbNow), "claimable at once")
	require.Empty(t, headers)
	require.Nil(t, leaseOwner)
	require.Nil(t, lastErr)
	require.Nil(t, ordering)
}

func TestConstraintsStopBadPlainInserts(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 256)
	for name, tt := range map[string]struct{ sql, constraint string }{
		"empty key":           {`INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('', 'webhook', '{}')`, "outbox_idempotency_key_length"},
		"long key":            {`INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('` + long + `', 'webhook', '{}')`, "outbox_idempotency_key_length"},
		"empty connector":     {`INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('k', '', '{}')`, "outbox_connector_format"},
		"unknown status":      {`INSERT INTO outbox (idempotency_key, connector, payload, status) VALUES ('k', 'webhook', '{}', 'sent')`, "outbox_status_known"},
		"webhook scalar":      {`INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('k', 'webhook:crm', '"x"')`, "outbox_payload_shape"},
		"email array":         {`INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('k', 'email', '[]')`, "outbox_payload_shape"},
		"delivering no lease": {`INSERT INTO outbox (idempotency_key, connector, payload, status) VALUES ('k', 'webhook', '{}', 'delivering')`, "outbox_lease_while_delivering"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := pgtest.Tx(t).Exec(t.Context(), tt.sql)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, tt.constraint, pgErr.ConstraintName)
		})
	}

	t.Run("null payload", func(t *testing.T) {
		t.Parallel()
		_, err := pgtest.Tx(t).Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('k', 'webhook', NULL)`)
		require.ErrorContains(t, err, "not-null")
	})
	t.Run("not json", func(t *testing.T) {
		t.Parallel()
		_, err := pgtest.Tx(t).Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('k', 'webhook', 'nope')`)
		require.ErrorContains(t, err, "invalid input syntax for type json")
	})
}

// While relays poll fast for every connector instance a running relay has
// (outbox_wake_connectors), inserts send no NOTIFY, so they do not serialise on
// PostgreSQL's notification lock; while a running relay's instance has none polling fast
// for it, they do, so that relay hears of its rows at once.
func TestInsertTriggerQuietWhileRelaysPollFast(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		marks  string // rows of outbox_wake_connectors: (connector, relay_id, seen_until, polling_until)
		notify bool
	}{
		{"no relay", ``, true},
		{"a relay, idle", `('webhook', 'b', 'infinity', '-infinity')`, true},
		{"a relay polling fast", `('webhook', 'a', 'infinity', 'infinity')`, false},
		{"one polls fast, another relay's instance idle",
			`('webhook', 'a', 'infinity', 'infinity'), ('webhook:a', 'b', 'infinity', '-infinity')`, true},
		{"both instances polled fast",
			`('webhook', 'a', 'infinity', 'infinity'), ('webhook:a', 'b', 'infinity', 'infinity')`, false},
		{"the idle instance's relay died (its word lapsed)",
			`('webhook', 'a', 'infinity', 'infinity'), ('webhook:a', 'b', '-infinity', '-infinity')`, false},
		{"a fast mark lapsed", `('webhook', 'a', 'infinity', clock_timestamp() - interval '1 second')`, true},
		{"one relay polls fast for an instance another relay has idle: the busy one finds its rows",
			`('webhook', 'a', 'infinity', 'infinity'), ('webhook', 'b', 'infinity', '-infinity')`, false},
		{"an instance no relay polls fast for, while one polls fast for another",
			`('webhook', 'a', 'infinity', 'infinity'), ('webhook:a', 'a', 'infinity', '-infinity'), ('webhook:a', 'b', 'infinity', '-infinity')`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.DB(t)
			listener, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer listener.Release()
			_, err = listener.Exec(ctx, `LISTEN outbox`)
			require.NoError(t, err)
			if tc.marks != "" {
				_, err = pool.Exec(ctx, `INSERT INTO outbox_wake_connectors (connector, relay_id, seen_until, polling_until) VALUES `+tc.marks)
				require.NoError(t, err)
			}

			_, err = pool.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('k', 'webhook', '{}')`)
			require.NoError(t, err)
			// Notifications arrive in commit order: if the insert notified, its
			// notification comes before this marker.
			_, err = pool.Exec(ctx, `SELECT pg_notify('outbox', 'marker')`)
			require.NoError(t, err)
			waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			n, err := listener.Conn().WaitForNotification(waitCtx)
			require.NoError(t, err)
			require.Equal(t, map[bool]string{true: "", false: "marker"}[tc.notify], n.Payload, "the insert notified: %v", tc.notify)
			_, _ = listener.Exec(context.WithoutCancel(ctx), `UNLISTEN *`)
		})
	}
}

// An application's role needs only INSERT on outbox to enqueue by plain SQL: the insert
// trigger reads the relays' outbox_wake_connectors with the inserting role's rights, and
// every role may read it. Before, every insert of a role granted no more failed
// ("permission denied for table outbox_wake_connectors").
func TestInsertNeedsOnlyInsertOnOutbox(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	role := fmt.Sprintf("outbox_app_%d", time.Now().UnixNano())
	_, err := pool.Exec(ctx, `CREATE ROLE `+role+` NOLOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP OWNED BY `+role+`; DROP ROLE `+role)
	})
	_, err = pool.Exec(ctx, `GRANT USAGE ON SCHEMA public TO `+role+`;
		GRANT INSERT ON outbox TO `+role)
	require.NoError(t, err)
	// A relay polls fast, so the trigger reads the marks' table to decide.
	_, err = pool.Exec(ctx, `INSERT INTO outbox_wake_connectors (connector, relay_id, seen_until, polling_until)
		VALUES ('webhook', 'r', 'infinity', 'infinity')`)
	require.NoError(t, err)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET ROLE `+role)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `RESET ROLE`) }()
	_, err = conn.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('app-1', 'webhook', '{}')`)
	require.NoError(t, err, "an insert by a role granted INSERT on outbox")
}
