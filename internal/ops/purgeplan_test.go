package ops

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// A batch of purge --payload-only starts after the rows the run's earlier batches
// purged, which stay in outbox_finished_age: it reads its own rows, not every row
// purged so far (which made a run over many rows read quadratically many).
func TestPurgePayloadBatchStartsAfterThePreviousOne(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, updated_at)
		SELECT 'k' || g, 'webhook', '{"n": 1}', 'delivered', $1::timestamptz - interval '2 days' + g / 2 * interval '1 second'
		FROM generate_series(1, 6000) g`, now)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `ANALYZE outbox`)
	require.NoError(t, err)

	// The run so far: batches of 500 until 5,000 rows are purged.
	var n int64
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	var afterID *int64
	var cursorID int64
	for range 10 {
		require.NoError(t, pool.QueryRow(t.Context(), purgePayloadSQL, now.Add(-24*time.Hour), 500, "t", "", now, after, cursorID).
			Scan(&n, &after, &afterID))
		require.EqualValues(t, 500, n)
		cursorID = *afterID
	}
	var left int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE payload <> '{}'`).Scan(&left))
	require.Equal(t, 1000, left)

	// The next batch, rolled back.
	lines := pgtest.Explain(t, pool, purgePayloadSQL, now.Add(-24*time.Hour), 500, "t", "", now, after, cursorID)
	plan := strings.Join(lines, "\n")
	// The rows the index scan read: those it passed on, and those its filter removed,
	// on the lines below it that are indented deeper than its own.
	read, found := 0, false
	for i, line := range lines {
		_, after, ok := strings.Cut(line, "Scan using outbox_finished_age on outbox (actual rows=")
		if !ok {
			continue
		}
		found = true
		read += atoi(t, strings.Fields(after)[0])
		indent := len(line) - len(strings.TrimLeft(line, " "))
		for _, l := range lines[i+1:] {
			if len(l)-len(strings.TrimLeft(l, " ")) <= indent {
				break
			}
			if _, removed, ok := strings.Cut(l, "Rows Removed by Filter: "); ok {
				read += atoi(t, removed)
			}
		}
	}
	require.True(t, found, plan)
	require.Less(t, read, 600, "the 11th batch of 500 read %d rows:\n%s", read, plan)
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	require.NoError(t, err)
	return n
}

// While a transaction holds an old snapshot (a long report, a backup), the rows a purge
// deleted keep live entries in outbox_finished_age: each batch starts after the
// previous batch's last row, so the fourth batch reads about what the first did, not
// the first three's rows again.
func TestPurgeDeleteBatchStartsAfterThePreviousOne(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, updated_at)
		SELECT 'k' || g, 'webhook', '{"n": 1}', 'delivered', $1::timestamptz - interval '2 days' + g / 3 * interval '1 second'
		FROM generate_series(1, 2500) g`, now)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `ANALYZE outbox`)
	require.NoError(t, err)

	old := pgtest.OldSnapshot(t, pool)
	var n int64

	cutoff := now.Add(-24 * time.Hour)
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	afterID := int64(math.MinInt64)
	// batch deletes one batch of 500 and returns the buffers its scan of
	// outbox_finished_age read, under EXPLAIN ANALYZE in a transaction rolled back first.
	batch := func() int {
		lines := pgtest.Explain(t, pool, purgeDeleteSQL, cutoff, 500, nil, after, afterID)
		var lastID *int64
		require.NoError(t, pool.QueryRow(t.Context(), purgeDeleteSQL, cutoff, 500, nil, after, afterID).Scan(&n, &after, &lastID))
		require.EqualValues(t, 500, n)
		afterID = *lastID
		return pgtest.ScanBuffers(t, lines, "Scan using outbox_finished_age")
	}
	first := batch()
	batch()
	batch()
	fourth := batch()
	require.Less(t, fourth, 2*first, "the fourth batch read %d buffers, the first %d", fourth, first)
	require.NoError(t, old.Rollback(t.Context()))

	res, err := Purge(t.Context(), pool, 24*time.Hour, PurgeOptions{BatchSize: 200, Now: now})
	require.NoError(t, err)
	require.Equal(t, 500, res.Rows, "the rest, rows that share a time included")
}
