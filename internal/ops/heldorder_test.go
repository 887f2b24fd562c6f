package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A held row with an ordering key (the relay held it because the receiver's key window
// passed, and says "replay with a new key or cancel") is refused by replay --new-key,
// which would leave the copy behind it in its key. The refusal says what leads somewhere:
// cancel it, then enqueue a new intent. A canceled row is never copied by replay
// --new-key: it may be one an approver rejected, whose copy would go out unapproved.
func TestHeldOrderedRowAdviceLeadsSomewhere(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "pay-1", Connector: "payment", Status: outbox.StatusHeld, Attempts: 2, OrderingKey: "cust-1",
		Payload: `{"operation": "payment_intent.create", "params": {"amount": 100, "currency": "eur"}}`, Age: 30 * time.Hour,
		LastError: "attempt 2 not sent: held: payment remembers idempotency keys for 24h0m0s ... check the receiver, then replay with a new key or cancel"})

	opts := ops.ReplayOptions{Actor: "op", NewKey: true, Now: base}
	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"pay-1"}}, opts)
	require.NoError(t, err)
	require.Contains(t, res.Refused["pay-1"], "cancel it, then enqueue a new intent under a new key")

	cres, err := ops.Cancel(t.Context(), pool, []string{"pay-1"}, "op", "as replay advised", base)
	require.NoError(t, err)
	require.Equal(t, []string{"pay-1"}, cres.Canceled)
	in, err := outbox.Enqueue(t.Context(), pool, outbox.Message{Key: outbox.Key("pay-1", "again"), Connector: "payment",
		Payload: map[string]any{"operation": "payment_intent.create", "params": map[string]any{"amount": 100, "currency": "eur"}}, OrderingKey: "cust-1"})
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status, "the new intent is not held back by the canceled row")
}
