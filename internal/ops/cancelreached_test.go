package ops_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Cancel answered "canceled" for a held row, or a pending one, after an attempt that may
// have reached the receiver (no answer, a connection lost mid-request, a relay whose lease
// expired mid-attempt), as for one never sent, and its doc promised canceled rows "are
// never sent": the receiver may have acted already, which canceling cannot undo. Replay
// warns of the same facts; cancel now lists such keys, with why, and still cancels them.
func TestCancelSaysWhichReceiversMayHaveActed(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "held", Connector: "webhook:crm", Status: outbox.StatusHeld, Ambiguous: true, Attempts: 1,
		LastError: "attempt 1: timeout (the receiver does not enforce the key, so the row is held: replay or cancel it)"})
	// Reclaimed after its relay's lease expired: pending, marked ambiguous.
	insertRow(t, pool, row{Key: "reclaimed", Status: outbox.StatusPending, Ambiguous: true, Attempts: 1})
	// A plain failure after an ambiguous attempt clears the row's mark; the log keeps it.
	earlier := insertRow(t, pool, row{Key: "earlier", Status: outbox.StatusPending, Attempts: 2, LastError: "attempt 2: 503"})
	// Delivered, then replayed with --redeliver.
	redelivered := insertRow(t, pool, row{Key: "redelivered", Status: outbox.StatusPending, Attempts: 1})
	plain := insertRow(t, pool, row{Key: "plain", Status: outbox.StatusPending, Attempts: 1, LastError: "attempt 1: 503"})
	insertRow(t, pool, row{Key: "fresh", Status: outbox.StatusPending})
	insertRow(t, pool, row{Key: "awaiting", Connector: "payment", Status: outbox.StatusAwaitingApproval})
	_, err := pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
VALUES ($1, 1, 'relay-1', $4::timestamptz - interval '2 minutes', $4::timestamptz - interval '1 minute', 'retry', true, 'timeout'),
       ($1, 2, 'relay-1', $4::timestamptz - interval '30 seconds', $4::timestamptz - interval '29 seconds', 'retry', false, '503'),
       ($2, 1, 'relay-1', $4::timestamptz - interval '2 minutes', $4::timestamptz - interval '1 minute', 'delivered', false, NULL),
       ($3, 1, 'relay-1', $4::timestamptz - interval '2 minutes', $4::timestamptz - interval '1 minute', 'retry', false, '503')`,
		earlier, redelivered, plain, base)
	require.NoError(t, err)

	keys := []string{"held", "reclaimed", "earlier", "redelivered", "plain", "fresh", "awaiting"}
	res, err := ops.Cancel(t.Context(), pool, keys, "alice", "order refunded", base)
	require.NoError(t, err)
	require.Equal(t, keys, res.Canceled, "canceled all the same")
	require.Empty(t, res.Refused)
	require.ElementsMatch(t, []string{"held", "reclaimed", "earlier", "redelivered"}, slices.Collect(maps.Keys(res.MayHaveActed)))
	require.Equal(t, "webhook:crm", res.MayHaveActed["held"].Connector)
	require.Equal(t, "webhook", res.MayHaveActed["earlier"].Connector)
	require.Contains(t, res.MayHaveActed["held"].Reason, "held after an attempt that may have reached the receiver")
	require.Contains(t, res.MayHaveActed["reclaimed"].Reason, "pending after an attempt that may have reached the receiver")
	require.Contains(t, res.MayHaveActed["earlier"].Reason, "cannot undo")
	for _, k := range keys {
		require.Equal(t, outbox.StatusCanceled, state(t, pool, k).Status)
	}

	// Canceling again changes nothing, and says so again: a client that lost the first
	// answer sends the cancel again.
	res, err = ops.Cancel(t.Context(), pool, []string{"held", "fresh"}, "alice", "", time.Time{})
	require.NoError(t, err)
	require.Equal(t, []string{"held", "fresh"}, res.Unchanged)
	require.Equal(t, []string{"held"}, slices.Collect(maps.Keys(res.MayHaveActed)))
	require.Contains(t, res.MayHaveActed["held"].Reason, "canceled after an attempt that may have reached the receiver")

	res, err = ops.Cancel(t.Context(), pool, []string{"fresh"}, "alice", "", time.Time{})
	require.NoError(t, err)
	require.NotNil(t, res.MayHaveActed, "{} in JSON, as the other fields")
	require.Empty(t, res.MayHaveActed)
}
