package payment_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/internal/stripemocktest"
)

// TestAnswerEchoingTheAPIKeyDoesNotShowIt: stripe-mock, which OUTBOX_PAYMENT_API_BASE
// is documented for, refuses a key that is not a test key (a live one, a restricted
// one left from production) with a 401 whose message quotes the request's Authorization
// header: "Authorization was 'Bearer sk_live_...'". The connector stored that message
// in the row's result and last_error, where the intent API and MCP show it to agents and
// inspect to operators: the Stripe secret key in full.
func TestAnswerEchoingTheAPIKeyDoesNotShowIt(t *testing.T) {
	t.Parallel()
	const liveKey = "sk_live_51HsEcReTkEy0123456789abcdef"
	tr := payment.DefaultTransport().Clone()
	t.Cleanup(tr.CloseIdleConnections)
	c, err := payment.New(payment.Config{APIKey: liveKey, APIBase: stripemocktest.Start(t), HTTPClient: &http.Client{Transport: tr}})
	require.NoError(t, err)

	raw, err := c.Deliver(t.Context(), delivery("k-echo", createPI))
	require.Error(t, err)
	require.Contains(t, err.Error(), "401", "stripe-mock refuses the live key")
	require.NotContains(t, err.Error(), liveKey, "last_error shows the Stripe secret key")
	require.NotContains(t, string(raw), liveKey, "the stored result shows the Stripe secret key")
}
