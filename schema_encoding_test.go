package outboxd_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	outboxd "github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// outboxd is not installed in a database whose encoding is not UTF8: there, messages the
// outbox package accepts fail at the INSERT and abort the caller's transaction (a key of
// 200 "é" in SQL_ASCII, whose char_length counts bytes; a payload with U+2028, which
// json.Marshal writes as \u2028 and jsonb then refuses). An installation that is there
// already is upgraded as it is.
func TestMigrateRefusesANewInstallationNotInUTF8(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, enc := range []string{"SQL_ASCII", "LATIN1"} {
		t.Run(enc, func(t *testing.T) {
			pool := pgtest.DBWithEncoding(t, enc)
			_, err := outboxd.Migrate(ctx, pool)
			require.ErrorIs(t, err, outboxd.ErrDatabaseNotUTF8)
			require.ErrorContains(t, err, "it is "+enc+",")
			var table *string
			require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('outbox')::text`).Scan(&table))
			require.Nil(t, table, "nothing was created")

			// What it protects from: installed anyway (by hand), an accepted message
			// fails at the INSERT and aborts the transaction.
			_, err = pool.Exec(ctx, outboxd.Schema)
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the test's end
			_, err = outbox.Enqueue(ctx, tx, outbox.Message{Key: strings.Repeat("é", 200), Connector: "webhook",
				Payload: map[string]string{"a": "x\u2028y"}})
			require.Error(t, err)
			require.NotErrorIs(t, err, outbox.ErrInvalidMessage)

			// An installation there already (an older outboxd's) is upgraded, not refused.
			_, err = pool.Exec(ctx, `UPDATE outbox_schema_migrations SET version = $1`, outboxd.SchemaVersion-1)
			require.NoError(t, err)
			from, err := outboxd.Migrate(ctx, pool)
			require.NoError(t, err)
			require.Equal(t, outboxd.SchemaVersion-1, from)
		})
	}
}
