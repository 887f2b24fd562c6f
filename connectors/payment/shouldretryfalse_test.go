package payment_test

import (
	"net/http"
	"testing"

	"github.com/outboxd/outboxd/connectors"
)

// stripe-go (and Stripe's other libraries) treat "Stripe-Should-Retry: false" as final:
// "The API may ask us not to retry (e.g. if doing so would be a no-op)". The connector
// honours "true" but ignores "false": a 500 Stripe saved against the key, marked not to
// retry, is retried (and backed off) anyway, and a 409 marked so is retried until the
// row runs out of attempts.
func TestDeliver_StripeShouldRetryFalseIsFinal(t *testing.T) {
	t.Parallel()
	for name, answer := range map[string]action{
		"500": {Status: http.StatusInternalServerError, Header: http.Header{"Stripe-Should-Retry": {"false"}},
			Body: `{"error":{"type":"api_error","message":"An unknown error occurred."}}`},
		"409": {Status: http.StatusConflict, Header: http.Header{"Stripe-Should-Retry": {"false"}},
			Body: `{"error":{"type":"invalid_request_error","message":"conflict"}}`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			key := "should-retry-false:" + name
			b.f.Plan(key, answer)
			_, err := b.c.Deliver(t.Context(), delivery(key, createPI))
			if !connectors.IsPermanent(err) {
				t.Fatalf("Stripe-Should-Retry: false, but the connector asks the relay to retry: %v", err)
			}
		})
	}
}
