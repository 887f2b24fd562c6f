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
// which would leave the copy behind it in its key. Following the advice, the operator
// cancels it; replay --new-key refused the canceled row too ("canceled rows stay
// canceled"), so no sequence of commands re-executed the row. A canceled row's copy is
// re-executed now; without NewKey it stays refused.
func TestHeldOrderedRowCanBeReExecutedAfterACancel(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "pay-1", Connector: "payment", Status: outbox.StatusHeld, Attempts: 2, OrderingKey: "cust-1",
		Payload: `{"operation": "payment_intent.create", "params": {"amount": 100}}`, Age: 30 * time.Hour,
		LastError: "attempt 2 not sent: held: payment remembers idempotency keys for 24h0m0s ... check the receiver, then replay with a new key or cancel"})

	opts := ops.ReplayOptions{Actor: "op", NewKey: true, Now: base}
	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"pay-1"}}, opts)
	require.NoError(t, err)
	require.Contains(t, res.Refused["pay-1"], "cancel it, then replay it with NewKey")

	cres, err := ops.Cancel(t.Context(), pool, []string{"pay-1"}, "op", "as replay advised", base)
	require.NoError(t, err)
	require.Equal(t, []string{"pay-1"}, cres.Canceled)

	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"pay-1"}}, ops.ReplayOptions{Actor: "op", Now: base})
	require.NoError(t, err)
	require.Contains(t, res.Refused["pay-1"], "canceled rows stay canceled", "without NewKey")

	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"pay-1"}}, opts)
	require.NoError(t, err)
	require.Empty(t, res.Refused["pay-1"], "replay --new-key after the advised cancel")
	require.Equal(t, []string{"pay-1"}, res.Replayed)
	copyKey := res.NewKeys["pay-1"]
	require.Equal(t, outbox.Key("pay-1", "replay", "1"), copyKey)
	in, err := outbox.Get(t.Context(), pool, copyKey)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
	require.Equal(t, "cust-1", in.OrderingKey)
	old, err := outbox.Get(t.Context(), pool, "pay-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusCanceled, old.Status, "the canceled row stays canceled")
}
