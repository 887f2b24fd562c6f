package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A replay selected by a filter decides each row by the status it reads under the row's
// lock, but never checks that the row still matches the filter. A dead row whose lease
// expired during its last attempt (ambiguous) accepts that attempt's late delivery
// (relay/sql.go, recordSQL): selected by --status dead, it may be delivered by the time
// its batch locks it. With Redeliver (needed for rows whose --new-key copy was
// delivered), the replay then puts a delivered row back, sending it again, though the
// operator asked for dead rows only, and no redelivery note names it (a delivered row is
// not in Ambiguous either). The late delivery is injected right after the filter's
// List query, before the batch locks the row.
func TestReplayByStatusFilterDoesNotRedeliverARowDeliveredSinceItWasSelected(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "late", Status: outbox.StatusDead, Attempts: 3, Ambiguous: true, Age: time.Hour,
		LastError: "relay r1 lost its lease during attempt 3; that was the last allowed attempt"})

	var hookErr error
	hook := pgtest.After("ORDER BY created_at DESC, id DESC", func() {
		// What recordSQL writes for the late delivery of attempt 3 of a dead, ambiguous row.
		_, hookErr = pool.Exec(context.WithoutCancel(t.Context()), `
WITH upd AS (
    UPDATE outbox SET status = 'delivered', result = '{"status": 200}', ambiguous = false,
           delivered_at = $1, updated_at = $1
    WHERE idempotency_key = 'late' AND status = 'dead' AND ambiguous AND attempts = 3
    RETURNING id)
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome)
SELECT id, 3, 'r1', $1, $1, 'delivered' FROM upd`, base.Add(-time.Minute))
	})
	hook.Arm()
	traced := pgtest.PoolWith(t, pool, hook)

	opts := replayOpts()
	opts.Redeliver = true
	res, err := ops.Replay(t.Context(), traced, ops.Selection{Filter: &ops.Filter{Status: []string{outbox.StatusDead}}}, opts)
	require.NoError(t, err)
	require.NoError(t, hookErr)
	require.True(t, hook.Ran(), "the late delivery was injected")

	require.Empty(t, res.Replayed, "a row delivered since --status dead selected it was put back: %+v", res)
	require.Equal(t, outbox.StatusDelivered, state(t, pool, "late").Status,
		"the delivered row was put back to pending, to be sent again")
}
