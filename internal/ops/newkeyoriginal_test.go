package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
)

// replay --new-key leaves the dead row as it is, so a plain replay run later (replay
// --status dead, for the rows that died since) selects it too. Put back under its own
// key, which the receiver never acted on, it executed the operation again: beside its
// copy still on its way, or after its copy was delivered, with nothing said. It is
// treated as replay --new-key treats the row: unchanged while the copy is on its way,
// refused once it was delivered (or is gone) unless Redeliver.
func TestReplayOfARowWhoseCopyWasExecutedDoesNotExecuteItAgain(t *testing.T) {
	t.Parallel()
	pool, sel, opts, first := copiedDeadRow(t)
	opts.NewKey = false

	res, err := ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed, "the row was put back beside its copy on its way: %+v", res)
	require.Equal(t, "dead", state(t, pool, "charge").Status)

	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', delivered_at = $2 WHERE idempotency_key = $1`,
		first, base)
	require.NoError(t, err)
	res, err = ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed, "the operation was executed again though its copy was delivered: %+v", res)
	require.Contains(t, res.Refused["charge"], first)
	require.Contains(t, res.Refused["charge"], "Redeliver")

	// Asked explicitly, it is executed once more.
	opts.Redeliver = true
	res, err = ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Equal(t, []string{"charge"}, res.Replayed)
}

// A copy that replay --new-key made died too (the receiver still broken), and replay
// --status dead selects the row and its copy together: both went back to pending, each
// under its own key, and the operation was executed twice. The copy, the operation's
// current row, is put back; the row is refused.
func TestReplayOfARowAndItsDeadCopyExecutesTheOperationOnce(t *testing.T) {
	t.Parallel()
	pool, sel, opts, first := copiedDeadRowWithDeadCopy(t)

	opts.NewKey = false
	res, err := ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Equal(t, []string{first}, res.Replayed, "%+v", res)
	require.Contains(t, res.Refused["charge"], "replay the copy instead")
	require.Equal(t, "dead", state(t, pool, "charge").Status)
}

// A copy that replay --new-key made may have acted (an ambiguous attempt), then died or
// was canceled: the operation may have happened. Executing the row again, with a new
// key or under its own, may then have the receiver act twice, which the result says
// (Ambiguous) of an ambiguous attempt of the row itself, and did not of one of its
// copy's.
func TestReplayOfARowWhoseCopyMayHaveActedIsAmbiguous(t *testing.T) {
	t.Parallel()
	for _, newKey := range []bool{true, false} {
		t.Run(map[bool]string{true: "new key", false: "own key"}[newKey], func(t *testing.T) {
			t.Parallel()
			pool, _, opts, first := copiedDeadRow(t)
			// Dead, a new-key replay copies it again; canceled, a replay puts the row back.
			status := map[bool]string{true: "dead", false: "canceled"}[newKey]
			_, err := pool.Exec(t.Context(), `UPDATE outbox SET status = $2, attempts = 2 WHERE idempotency_key = $1`, first, status)
			require.NoError(t, err)
			_, err = pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
SELECT id, g, 'relay-1', $2, $2, 'retry', g = 1, 'attempt ' || g
FROM outbox, generate_series(1, 2) g WHERE idempotency_key = $1`, first, base)
			require.NoError(t, err)

			opts.NewKey = newKey
			res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"charge"}}, opts)
			require.NoError(t, err)
			require.Equal(t, []string{"charge"}, res.Replayed, "%+v", res)
			require.Equal(t, "webhook", res.Ambiguous["charge"], "its copy may have acted: %+v", res)
		})
	}
}

// Two rounds of replay --new-key with the receiver still broken leave the row and two
// dead copies. replay --status dead then selects both copies: each went back under its
// own key, and the operation was executed twice. Only the latest copy, the operation's
// current row, is put back.
func TestReplayOfTwoDeadCopiesExecutesTheOperationOnce(t *testing.T) {
	t.Parallel()
	pool, sel, opts, first := copiedDeadRowWithDeadCopy(t)
	res, err := ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	second := res.NewKeys["charge"]
	require.NotEmpty(t, second)
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead' WHERE idempotency_key = $1`, second)
	require.NoError(t, err)

	opts.NewKey = false
	res, err = ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Equal(t, []string{second}, res.Replayed, "%+v", res)
	require.Contains(t, res.Refused[first], second)
}

// replay --redeliver of a row whose copy that replay --new-key made was delivered puts
// the row back under its own key, on purpose. Selecting the copy too (--key both, or a
// filter such as --status dead,delivered) put both back, each under its own key, and
// the operation was executed twice more. One of them is put back, the other refused.
func TestRedeliverOfARowAndItsDeliveredCopyExecutesTheOperationOnce(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{0, 1} {
		t.Run(map[int]string{0: "one batch", 1: "a batch each"}[batch], func(t *testing.T) {
			t.Parallel()
			pool, _, opts, first := copiedDeadRow(t)
			_, err := pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', delivered_at = $2 WHERE idempotency_key = $1`,
				first, base)
			require.NoError(t, err)
			opts.NewKey, opts.Redeliver, opts.BatchSize = false, true, batch
			sel := ops.Selection{Keys: []string{"charge", first}}

			for _, dry := range []bool{true, false} {
				opts.DryRun = dry
				res, err := ops.Replay(t.Context(), pool, sel, opts)
				require.NoError(t, err)
				require.Equal(t, []string{"charge"}, res.Replayed, "dry run %v: %+v", dry, res)
				require.Contains(t, res.Refused[first], `"charge"`, "dry run %v", dry)
			}
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM outbox WHERE status = 'pending'`),
				"the operation was executed more than once more")
		})
	}
}

// Of two copies that replay --new-key made, the earlier is refused, naming the later as
// the one to replay. When the operator had canceled the later one, that was not true
// (replaying it is refused: canceled rows stay canceled); the row they copy, which its
// canceled copy no longer holds back, is the one to replay.
func TestReplayOfAnEarlierCopyNamesTheRowWhenTheLaterWasCanceled(t *testing.T) {
	t.Parallel()
	pool, sel, opts, first := copiedDeadRowWithDeadCopy(t)
	res, err := ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	second := res.NewKeys["charge"]
	_, err = ops.Cancel(t.Context(), pool, []string{second}, "op", "", base)
	require.NoError(t, err)

	opts.NewKey = false
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{first}}, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed)
	require.NotContains(t, res.Refused[first], "replay that one instead", "it is canceled: %s", res.Refused[first])
	require.Contains(t, res.Refused[first], `replay "charge"`)

	// As said, the row is replayed.
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"charge"}}, opts)
	require.NoError(t, err)
	require.Equal(t, []string{"charge"}, res.Replayed, "%+v", res)
}

// The row that replay --new-key copied may have acted (an ambiguous attempt) before it
// died: the operation may have happened. Its copy, dead after plain failures, put back
// under its own key executes the operation again, which may have the receiver act
// twice, as TestReplayOfARowWhoseCopyMayHaveActedIsAmbiguous says of the row after its
// copy's attempt; the result listed the copy as ambiguous only for an attempt of its own.
func TestReplayOfACopyWhoseRowMayHaveActedIsAmbiguous(t *testing.T) {
	t.Parallel()
	pool, _, opts, first := copiedDeadRowWithDeadCopy(t)
	_, err := pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
SELECT id, 1, 'relay-1', $2, $2, 'retry', true, 'timeout' FROM outbox WHERE idempotency_key = $1`, "charge", base)
	require.NoError(t, err)

	opts.NewKey = false
	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{first}}, opts)
	require.NoError(t, err)
	require.Equal(t, []string{first}, res.Replayed, "%+v", res)
	require.Equal(t, "webhook", res.Ambiguous[first], "the row it copies may have acted: %+v", res)
	require.Equal(t, []string{first}, res.AmbiguousByCopy, "that attempt carried another key")
}

// A row whose copy that replay --new-key made was delivered is put back under its own
// key with Redeliver. Redelivering the copy later, while that row was on its way, put it
// back too, and the operation was executed twice at once; it is refused, as the row is
// while its copy is on its way.
func TestReplayOfACopyWhoseRowIsOnItsWayIsRefused(t *testing.T) {
	t.Parallel()
	pool, _, opts, first := copiedDeadRow(t)
	_, err := pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', delivered_at = $2 WHERE idempotency_key = $1`,
		first, base)
	require.NoError(t, err)
	opts.NewKey, opts.Redeliver = false, true
	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"charge"}}, opts)
	require.NoError(t, err)
	require.Equal(t, []string{"charge"}, res.Replayed, "%+v", res)

	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{first}}, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed, "the copy was put back beside its row on its way: %+v", res)
	require.Contains(t, res.Refused[first], `"charge"`)
	require.Equal(t, "delivered", state(t, pool, first).Status)
}

// A row whose copy that replay --new-key made is still on its way is refused, saying to
// cancel the copy first. A relay delivering the copy has it in flight, and cancel
// refuses it ("its outcome decides"): the text said what cannot be done.
func TestReplayOfARowWhoseCopyIsInFlightSaysToWait(t *testing.T) {
	t.Parallel()
	pool, sel, opts, first := copiedDeadRow(t)
	_, err := pool.Exec(t.Context(), `
UPDATE outbox SET status = 'delivering', lease_owner = 'relay-1', lease_expires_at = $2, attempts = 1
WHERE idempotency_key = $1`, first, base.Add(time.Minute))
	require.NoError(t, err)
	canceled, err := ops.Cancel(t.Context(), pool, []string{first}, "op", "", base)
	require.NoError(t, err)
	require.Contains(t, canceled.Refused, first, "cancel refuses a row in flight")

	opts.NewKey = false
	res, err := ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed)
	require.NotContains(t, res.Refused["charge"], "cancel the copy first", res.Refused["charge"])
	require.Contains(t, res.Refused["charge"], "outcome")
}
