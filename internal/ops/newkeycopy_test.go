package ops_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A copy that replay --new-key made of a dead row is the same operation. When the copy
// died too (the receiver still broken), the next replay --status dead --new-key selects
// both the row and its copy, and copied each: the operation was executed twice more.
// The copy is refused, and the row it copies is re-executed once.
func TestReplayNewKeyCopiesAnOperationOnce(t *testing.T) {
	t.Parallel()
	pool, sel, opts, first := copiedDeadRowWithDeadCopy(t)

	res, err := ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Equal(t, []string{"charge"}, res.Replayed, "%+v", res)
	require.Equal(t, outbox.Key("charge", "replay", "2"), res.NewKeys["charge"])
	require.Contains(t, res.Refused[first], `a copy that replay --new-key made of "charge"`)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM outbox WHERE status = 'pending'`),
		"the operation was executed more than once more")

	// Named by key, the copy is refused too: replaying its row later would not see a
	// copy of the copy, and would execute the operation once more.
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{first}}, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed)
	require.Contains(t, res.Refused[first], "charge")

	// Put back under its own key, the latest copy is the operation's current attempt, as
	// any row; an earlier one is not, and would run the operation beside it.
	opts.NewKey = false
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{first}}, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed)
	second := outbox.Key("charge", "replay", "2")
	require.Contains(t, res.Refused[first], second)
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead' WHERE idempotency_key = $1`, second)
	require.NoError(t, err)
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{second}}, opts)
	require.NoError(t, err)
	require.Equal(t, []string{second}, res.Replayed)
}

// copiedDeadRow inserts the dead row "charge" and replays it with a new key, as
// replay --status dead --new-key does, and returns the database, that selection and
// those options, and the copy's key.
func copiedDeadRow(t *testing.T) (*pgxpool.Pool, ops.Selection, ops.ReplayOptions, string) {
	t.Helper()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "charge", Status: outbox.StatusDead, Attempts: 3, Age: time.Hour})
	opts := ops.ReplayOptions{Actor: "op", NewKey: true, Now: base}
	sel := ops.Selection{Filter: &ops.Filter{Status: []string{outbox.StatusDead}, Now: base}}
	res, err := ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	first := outbox.Key("charge", "replay", "1")
	require.Equal(t, first, res.NewKeys["charge"])
	return pool, sel, opts, first
}

// copiedDeadRowWithDeadCopy is copiedDeadRow, with the copy dead too (the receiver still
// broken).
func copiedDeadRowWithDeadCopy(t *testing.T) (*pgxpool.Pool, ops.Selection, ops.ReplayOptions, string) {
	t.Helper()
	pool, sel, opts, first := copiedDeadRow(t)
	_, err := pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead' WHERE idempotency_key = $1`, first)
	require.NoError(t, err)
	return pool, sel, opts, first
}

// A held row stays held once replay --new-key copied it, and its operator cancels it to
// clear it. Its copy, dead too, was then refused a new-key replay saying "re-execute that
// row instead", which is refused (canceled rows stay canceled): the text sent the
// operator in a circle. It says what can be done: replay the copy under its own key.
func TestReplayNewKeyOfACopyOfACanceledRowSaysWhatToDo(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "charge", Status: outbox.StatusHeld, Attempts: 1, Age: time.Hour})
	opts := ops.ReplayOptions{Actor: "op", NewKey: true, Now: base}
	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"charge"}}, opts)
	require.NoError(t, err)
	first := res.NewKeys["charge"]
	require.NotEmpty(t, first, "%+v", res)
	_, err = ops.Cancel(t.Context(), pool, []string{"charge"}, "op", "its copy re-executes it", base)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead' WHERE idempotency_key = $1`, first)
	require.NoError(t, err)

	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{first}}, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed)
	require.NotContains(t, res.Refused[first], "re-execute that row instead", "it is canceled: %s", res.Refused[first])
	require.Contains(t, res.Refused[first], "without --new-key")

	// As said, it is put back under its own key.
	opts.NewKey = false
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{first}}, opts)
	require.NoError(t, err)
	require.Equal(t, []string{first}, res.Replayed, "%+v", res)
}
