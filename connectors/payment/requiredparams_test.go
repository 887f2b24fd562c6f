package payment_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/internal/stripemocktest"
)

// CheckPayload, which Enqueue and the intent API run for payment rows, accepts a
// payment_intent.create without "amount" or "currency", both required by Stripe's API.
// Such a row is written (an agent's intent may wait for a person's approval), and then
// dies on its first attempt with Stripe's "Missing required param": the fault was
// knowable before the row was written, and no attempt could ever succeed.
func TestCheckPayload_RequiredParamsOfPaymentIntentCreate(t *testing.T) {
	t.Parallel()
	c := newConnector(t, stripemocktest.Start(t))
	for name, payload := range map[string]string{
		"NoCurrency": `{"operation":"payment_intent.create","params":{"amount":2000}}`,
		"NoAmount":   `{"operation":"payment_intent.create","params":{"currency":"usd"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := c.Deliver(t.Context(), delivery("required:"+name, payload))
			require.True(t, connectors.IsPermanent(err), "stripe-mock refuses it on every attempt: %v", err)
			require.Error(t, payment.CheckPayload([]byte(payload)),
				"CheckPayload accepts a payload Stripe refuses on every attempt (Deliver: %v)", err)
		})
	}
}
