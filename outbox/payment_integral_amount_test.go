package outbox_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Enqueue accepts {"amount": 100.0} and treats it as the same request as {"amount": 100}
// (payloads compare by value). jsonb keeps the number's scale, so the relay reads
// "amount": 100.0 back, and the payment connector refused it permanently: the row that
// Enqueue accepted, and an approver approved, can only go dead.
func TestEnqueue_PaymentAmountWithZeroFractionIsDeliverable(t *testing.T) {
	t.Parallel()
	var form url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		form, _ = url.ParseQuery(string(b))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"payment_intent","id":"pi_1","status":"requires_payment_method","amount":100,"currency":"eur","livemode":false}`)
	}))
	t.Cleanup(srv.Close)
	c, err := payment.New(payment.Config{APIKey: "sk_test_x", APIBase: srv.URL})
	require.NoError(t, err)

	tx := pgtest.Tx(t)
	ctx := context.WithoutCancel(t.Context())
	_, err = outbox.Enqueue(ctx, tx, outbox.Message{Key: "amount-100.0", Connector: "payment",
		Payload: json.RawMessage(`{"operation":"payment_intent.create","params":{"amount":100.0,"currency":"eur"}}`)})
	require.NoError(t, err)
	var stored string
	require.NoError(t, tx.QueryRow(ctx, `SELECT payload::text FROM outbox WHERE idempotency_key = 'amount-100.0'`).Scan(&stored))
	t.Logf("stored payload: %s", stored)

	_, err = c.Deliver(t.Context(), connectors.Delivery{Key: "amount-100.0", Attempt: 1, Payload: json.RawMessage(stored)})
	require.NoError(t, err, "the stored row cannot be delivered")
	require.Equal(t, "100", form.Get("amount"))
}
