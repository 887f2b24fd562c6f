package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A replay paced by Rate (or just large) runs for minutes, batch after batch. It read
// the database's clock once, at the start, and decided every batch with it: a row whose
// lease expired after the start was refused as "in flight" until a time already past,
// and each batch's audit entries and updated_at carried the start time, so the relay's
// rule that a late outcome of an attempt started before the replay is not written over
// it (relay/sql.go, recordSQL) compared attempts with a time earlier than the replay.
// Each batch now reads the clock when it runs.
func TestReplayReadsTheClockForEachBatch(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "a", Status: outbox.StatusDead, Attempts: 3})
	insertRow(t, pool, row{Key: "b", Status: outbox.StatusDelivering, Attempts: 1, LeaseIn: time.Hour})

	var hookErr error
	opts := ops.ReplayOptions{Actor: "alice", BatchSize: 1, ProgressFunc: func(done, _ int) {
		if done != 1 {
			return
		}
		// b's relay vanished after the replay started: its lease ran out a microsecond
		// after the time the first batch was decided at.
		_, hookErr = pool.Exec(t.Context(), `
UPDATE outbox SET lease_expires_at = (SELECT at FROM outbox_audit) + interval '1 microsecond'
WHERE idempotency_key = 'b'`)
	}}
	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"a", "b"}}, opts)
	require.NoError(t, err)
	require.NoError(t, hookErr)
	require.Equal(t, []string{"a", "b"}, res.Replayed, "refused: %v", res.Refused)
	// The second batch's entry carries the second batch's time.
	require.Equal(t, 1, count(t, pool, `
SELECT count(*) FROM outbox_audit b JOIN outbox o ON o.id = b.outbox_id
WHERE o.idempotency_key = 'b' AND b.at > (SELECT a.at FROM outbox_audit a JOIN outbox r ON r.id = a.outbox_id
                                          WHERE r.idempotency_key = 'a')`))
}
