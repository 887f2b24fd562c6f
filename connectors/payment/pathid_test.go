package payment_test

import (
	"fmt"
	"testing"

	"github.com/outboxd/outboxd/connectors"
)

// The package documentation: "a missing or malformed "id" ... [is] permanent, and
// nothing is sent". An id that is a dot segment is not a Stripe object id: sent, it
// makes the path /v1/payment_intents/../confirm (which servers normalise to /v1/confirm)
// or /v1/payment_intents/./cancel (/v1/payment_intents/cancel: a POST updating a
// PaymentIntent named "cancel"), another endpoint than the operation names. A control
// character is not part of any Stripe id either.
func TestDeliver_DotSegmentIDIsRefusedUnsent(t *testing.T) {
	t.Parallel()
	url, take := recordingStripe(t, `{"object":"payment_intent","id":"pi_1","status":"canceled","livemode":false}`)
	c := newConnector(t, url)

	for i, tc := range []struct{ op, id string }{
		{"payment_intent.confirm", ".."},
		{"payment_intent.cancel", "."},
		{"payment_intent.cancel", `pi_\u0001`},
	} {
		payload := fmt.Sprintf(`{"operation":%q,"params":{"id":"%s"}}`, tc.op, tc.id)
		raw, err := c.Deliver(t.Context(), delivery(fmt.Sprintf("dot:%d", i), payload))
		sent, _ := take()
		if len(sent) != 0 || !connectors.IsPermanent(err) {
			t.Errorf("%s with id %s: sent %q, result %s, err %v; want refused (permanent) with nothing sent", tc.op, tc.id, sent, raw, err)
		}
	}
}
