package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// In the simple protocol and the exec mode (the README's advice behind a transaction
// pooler) pgx reads every result as text, and a timestamp's text follows the session's
// DateStyle, which pgx reads only in the ISO style. On a database set to another
// (SQL, German, Postgres) the relay started and said it was ready, and every round
// failed to read what it claimed (the session each write is tied to, the claimed rows'
// times): no row was ever delivered, with a warning once a minute. Run now fails at
// once, saying what to set; the connection's own datestyle=ISO lets it run, and the
// modes that read timestamps in binary run as before.
func TestRunFailsAtOnceOnANonISODateStyleWithTextResults(t *testing.T) {
	t.Parallel()
	// setupDateStyle sets the test's database to the SQL style, as a database an older
	// application set up might be.
	setupDateStyle := func(t *testing.T) *testBundle {
		t.Helper()
		b := setup(t, receiver.Options{})
		var db string
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT current_database()`).Scan(&db))
		_, err := b.pool.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET datestyle = 'SQL, DMY'`)
		require.NoError(t, err)
		return b
	}
	poolFor := func(t *testing.T, b *testBundle, mode pgx.QueryExecMode, params map[string]string) *pgxpool.Pool {
		t.Helper()
		cfg := b.pool.Config().Copy()
		cfg.ConnConfig.DefaultQueryExecMode = mode
		for k, v := range params {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setupDateStyle(t)
			r, err := New(poolFor(t, b, mode, nil), b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
			require.NoError(t, err)
			// Well inside the relay's wait for a database that is not up (30 s).
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			err = r.Run(ctx)
			require.ErrorContains(t, err, `DateStyle is "SQL, DMY"`)
			require.ErrorContains(t, err, "datestyle=ISO")
		})
		t.Run(mode.String()+"/with datestyle=ISO", func(t *testing.T) {
			t.Parallel()
			b := setupDateStyle(t)
			start(t, poolFor(t, b, mode, map[string]string{"datestyle": "ISO"}), b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
			enqueue(t, b.pool, "iso", "webhook", []int{1})
			waitStatus(t, b.pool, "iso", outbox.StatusDelivered)
		})
	}
	t.Run("binary results", func(t *testing.T) {
		t.Parallel()
		b := setupDateStyle(t)
		start(t, poolFor(t, b, pgx.QueryExecModeCacheStatement, nil), b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
		enqueue(t, b.pool, "binary", "webhook", []int{1})
		waitStatus(t, b.pool, "binary", outbox.StatusDelivered)
	})
}
