package outbox_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A request whose row was written before a rule that now refuses it (by an older
// outboxd, or by plain SQL, which the table's constraints alone check) is that intent
// when it is asked again: its stored outcome is the answer to the key, as for any
// request asked again. Enqueue answered ErrInvalidMessage, so a step retried after an
// upgrade was told its request was invalid though it had been written, and delivered.
// A different request under the key, or an invalid one under a new key, is refused as
// before, and nothing is written.
func TestSameRequestWrittenBeforeARuleIsTheIntent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)
	// An email without a subject: the SMTP connector sends it, Enqueue refuses it.
	const noSubject = `{"to": "a@example.com", "text": "Your order shipped"}`
	_, err := tx.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, delivered_at)
		VALUES ('order-7/shipped', 'email', $1, 'delivered', 1, now())`, noSubject)
	require.NoError(t, err)
	msg := outbox.Message{Key: "order-7/shipped", Connector: "email", Payload: json.RawMessage(`{"text":"Your order shipped","to":"a@example.com"}`)}

	in, err := outbox.Enqueue(ctx, tx, msg)
	require.NoError(t, err, "the same request, written before")
	require.False(t, in.Inserted)
	require.Equal(t, outbox.StatusDelivered, in.Status)

	got, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{webhookMsg("new-1", []int{1}), msg})
	require.NoError(t, err)
	require.True(t, got[0].Inserted)
	require.False(t, got[1].Inserted)
	require.Equal(t, outbox.StatusDelivered, got[1].Status)

	got, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{msg})
	require.NoError(t, err, "a batch of it alone")
	require.False(t, got[0].Inserted)

	other := msg
	other.Payload = json.RawMessage(`{"to": "a@example.com", "text": "Your order was lost"}`)
	_, err = outbox.Enqueue(ctx, tx, other)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage, "another request under the key")
	fresh := msg
	fresh.Key = "order-8/shipped"
	_, err = outbox.Enqueue(ctx, tx, fresh)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage, "a new key")
	_, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{webhookMsg("new-2", []int{2}), fresh})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage, "a new key in a batch")
	require.Equal(t, 2, countRows(t, tx), "nothing else written, and the transaction is usable")
}
