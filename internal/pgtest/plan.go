package pgtest

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// ScanBuffers returns the shared buffers (hit and read together: a page that left the
// cache counts all the same) of the first node of an EXPLAIN (ANALYZE, BUFFERS) plan,
// given as its lines, whose line contains node, such as "Index Scan using
// outbox_pending_due". It fails the test when the plan has no such node or no buffers
// for it.
func ScanBuffers(t testing.TB, lines []string, node string) int {
	t.Helper()
	for i, line := range lines {
		if !strings.Contains(line, node) {
			continue
		}
		for _, l := range lines[i+1:] {
			_, counts, ok := strings.Cut(l, "Buffers: shared ")
			if !ok {
				continue
			}
			n := 0
			for _, f := range strings.Fields(counts) {
				name, v, _ := strings.Cut(f, "=")
				if name == "hit" || name == "read" {
					k, err := strconv.Atoi(v)
					require.NoError(t, err, l)
					n += k
				}
			}
			return n
		}
	}
	require.Fail(t, "no buffers for "+node, strings.Join(lines, "\n"))
	return 0
}

// Explain runs query with args under EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)
// in a transaction it rolls back, so what the query writes is undone, and returns the
// plan's lines.
func Explain(t testing.TB, pool *pgxpool.Pool, query string, args ...any) []string {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	rows, err := tx.Query(t.Context(), `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) `+query, args...)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(t.Context()))
	return lines
}

// OldSnapshot begins a REPEATABLE READ transaction that holds its snapshot (a long
// report, a backup), so the rows deleted meanwhile keep live index entries, and rolls
// it back when the test ends if the test did not.
func OldSnapshot(t testing.TB, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	old, err := pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = old.Rollback(context.Background()) })
	_, err = old.Exec(t.Context(), `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	var n int64
	require.NoError(t, old.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n))
	return old
}
