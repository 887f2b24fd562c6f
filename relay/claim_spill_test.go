package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// A claim reads every candidate row's payload to count it (up to the batch size), but
// it must not carry all those payloads through its CTE and its sort: a batch of 1,000
// rows of 8 kB then spilled some 16 MB to temporary files on every claim (an external
// sort at the default work_mem), and claiming them took two to three times as long,
// five times as long when the byte bound took only a few of them.
func TestClaimDoesNotSortPayloads(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, next_attempt_at)
		SELECT 'k' || g, 'webhook',
		       jsonb_build_object('d', (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 250) i)),
		       now() - interval '1 hour'
		FROM generate_series(1, 1000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `ANALYZE outbox`)
	require.NoError(t, err)

	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(t.Context()) }()
	_, err = tx.Exec(t.Context(), `SET LOCAL work_mem = '4MB'`) // PostgreSQL's default
	require.NoError(t, err)
	head := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	rows, err := tx.Query(t.Context(), `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) `+claimSQL,
		"webhook", time.Now().Add(time.Minute), 1000, "r", time.Now().Add(time.Hour), head, int64(1<<20))
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "Update on outbox o (actual rows=13", "the byte bound takes about 130 rows: %s", plan)
	require.NotContains(t, plan, "temp written", plan)
	require.NotContains(t, plan, "external", plan)
}
