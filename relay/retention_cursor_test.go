package relay

import (
	"bytes"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// While a transaction holds an old snapshot (a long report, a backup), the rows a
// retention pass deleted keep live entries in outbox_finished_age: each batch starts
// after the previous batch's last row, not at the oldest entry, so the fourth batch
// reads about what the first did, not the first three's rows again. A pass still
// deletes every row past retention.
func TestRetentionBatchStartsAfterThePreviousOne(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, updated_at)
		SELECT 'k' || g, 'webhook', '{"n": 1}', 'delivered', 1, now() - interval '30 days' + g / 3 * interval '1 second'
		FROM generate_series(1, 4500) g`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `ANALYZE outbox`)
	require.NoError(t, err)

	old := pgtest.OldSnapshot(t, pool)
	var n int64

	cutoff := time.Now().Add(-7 * 24 * time.Hour)
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	afterID := int64(math.MinInt64)
	// batch deletes one batch and returns the buffers its scan of outbox_finished_age
	// read, under EXPLAIN ANALYZE in a transaction rolled back first.
	batch := func() int {
		lines := pgtest.Explain(t, pool, retentionSQL, cutoff, retentionBatch, []string{"webhook"}, after, afterID)
		// The same batch again, for real and for its cursor.
		var lastID *int64
		require.NoError(t, pool.QueryRow(t.Context(), retentionSQL, cutoff, retentionBatch, []string{"webhook"}, after, afterID).
			Scan(&n, &after, &lastID))
		require.EqualValues(t, retentionBatch, n)
		afterID = *lastID
		return pgtest.ScanBuffers(t, lines, "Index Scan using outbox_finished_age")
	}
	first := batch()
	batch()
	batch()
	fourth := batch()
	require.Less(t, fourth, 2*first, "the fourth batch read %d buffers, the first %d", fourth, first)
	require.NoError(t, old.Rollback(t.Context()))

	r, err := New(pool, &Config{}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.deleteExpired(t.Context())
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n))
	require.Zero(t, n, "a pass deletes every row past retention, rows that share a time included")
}

// A pass of more than one batch works in every query exec mode: its cursor starts at
// -infinity and the least bigint, which the simple protocol writes into the text.
func TestRetentionInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.InMode(t, pgtest.DB(t), mode)
			_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, updated_at)
				SELECT 'k' || g, 'webhook', '{}', 'delivered', 1, now() - interval '30 days'
				FROM generate_series(1, $1::int) g`, retentionBatch+1)
			require.NoError(t, err)
			r, err := New(pool, &Config{}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
			require.NoError(t, err)
			r.deleteExpired(t.Context())
			var n int
			require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n))
			require.Zero(t, n)
		})
	}
}

// A retention batch the database refuses (here the relay's role may not delete) is a
// failure, reported as any other: each batch runs under a bound of its own
// (maintainTimeout), whose cancel, called before the failure was looked at, read as the
// relay stopping, and every failure of retention went unsaid but a timeout.
func TestRetentionFailureIsReported(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, updated_at)
		VALUES ('old', 'webhook', '{}', 'delivered', 1, now() - interval '30 days')`)
	require.NoError(t, err)
	role := pgtest.Role(t, pool, "outboxd_nodelete_",
		`GRANT SELECT, INSERT, UPDATE ON outbox, outbox_wake_connectors TO ROLE_`,
		`GRANT SELECT, INSERT ON outbox_attempts TO ROLE_`)
	r, err := New(pgtest.PoolAs(t, pool, role), &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.deleteExpired(t.Context())
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("retention")),
		"the refused batch is counted, and warned about")
}

// A pass that fails after some batches (here its second: a row the database refuses to
// delete) says how many rows it deleted before the failure: it said only that it
// failed, and an operator watching a backlog go took it for one that deleted nothing.
func TestRetentionSaysWhatItDeletedBeforeAFailure(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, updated_at)
		SELECT 'k' || g, 'webhook', '{}', 'delivered', 1, now() - interval '30 days'
		FROM generate_series(1, $1::int) g`, retentionBatch)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, updated_at)
VALUES ('kept', 'webhook', '{}', 'delivered', 1, now() - interval '29 days');
CREATE FUNCTION test_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'this row is kept';
END $$;
CREATE TRIGGER test_keep BEFORE DELETE ON outbox FOR EACH ROW WHEN (OLD.idempotency_key = 'kept') EXECUTE FUNCTION test_keep();`)
	require.NoError(t, err)
	var logs bytes.Buffer
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewJSONHandler(&logs, nil))},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.deleteExpired(t.Context())
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("retention")), "the second batch failed")
	var deleted []any
	for _, rec := range logRecords(t, &logs) {
		if rec["msg"] == "deleted finished rows past retention" {
			deleted = append(deleted, rec["rows"])
		}
	}
	require.Equal(t, []any{float64(retentionBatch)}, deleted, "the first batch's rows are said: %s", logs.String())
}
