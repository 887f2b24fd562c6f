package ops

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// A listing of one status that needs a person (list --status dead, page after page)
// reads its page from outbox_needs_attention in the index's order and stops there: not
// every row of the status, sorted, for every page. It lists the same rows, in the same
// order, as a listing of several statuses does.
func TestListOneStatusReadsOnlyItsPage(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, created_at)
		SELECT 'k' || g, 'webhook', '{}',
		       CASE WHEN g % 10 = 0 THEN 'dead' WHEN g % 50 = 1 THEN 'held' ELSE 'delivered' END,
		       timestamptz '2030-06-01 12:00:00Z' - g / 2 * interval '1 second'
		FROM generate_series(1, 30000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `ANALYZE outbox`)
	require.NoError(t, err)
	now := time.Date(2030, 6, 1, 13, 0, 0, 0, time.UTC)

	f := Filter{Status: []string{"dead"}, Limit: 50, Now: now}
	args, err := f.listArgs()
	require.NoError(t, err)
	rows, err := pool.Query(t.Context(), `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) `+listSQL, append(args, 51)...)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	m := regexp.MustCompile(`Scan (?:using|on) outbox_needs_attention(?: on outbox)? \(actual rows=(\d+)`).FindStringSubmatch(plan)
	require.NotNil(t, m, plan)
	read, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.LessOrEqual(t, read, 51, "the first page of 3,000 dead rows read %d of them:\n%s", read, plan)
	require.NotContains(t, plan, "Sort", plan)

	// Every page, as = ANY of the same status (repeated, so that it is used) lists them.
	pages := func(statuses []string) []string {
		var keys []string
		f := Filter{Status: statuses, Limit: 700, Now: now}
		for {
			page, err := List(t.Context(), pool, f)
			require.NoError(t, err)
			for _, in := range page.Intents {
				keys = append(keys, in.Key)
			}
			if page.Next == "" {
				return keys
			}
			f.After = page.Next
		}
	}
	one := pages([]string{"dead"})
	require.Len(t, one, 3000)
	require.Equal(t, pages([]string{"dead", "dead"}), one)
	require.Equal(t, "k10", one[0], "newest first")
	require.False(t, slices.Contains(pages([]string{"held"}), "k10"))
}
