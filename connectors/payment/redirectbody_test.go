package payment_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// stripe-go reads any answer below 400 as the object it asked for, so a redirect whose
// body is JSON (an API gateway's {"message": "moved"}) went on as if Stripe had answered
// 2xx: without an object and id it was taken as an unreadable success, ambiguous and
// retried to dead as if Stripe may have acted, and with them it was stored as delivered,
// though the package documentation says a 3xx is final and the request went nowhere.
func TestDeliver_RedirectWithJSONBodyIsPermanent(t *testing.T) {
	t.Parallel()
	for name, answer := range map[string]action{
		"message": {Status: http.StatusMovedPermanently, Header: http.Header{"Location": {"https://api.example.com/v1/payment_intents"}},
			Body: `{"message":"moved to https://api.example.com"}`},
		"object": {Status: http.StatusPermanentRedirect, Header: http.Header{"Location": {"https://api.example.com/v1/payment_intents"}},
			Body: `{"object":"payment_intent","id":"pi_elsewhere","status":"succeeded"}`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			key := "redirect-json:" + name
			b.f.Plan(key, answer)
			res, err := b.c.Deliver(t.Context(), delivery(key, createPI))
			require.Nil(t, res, "a redirect is no answer of Stripe's to store")
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.False(t, connectors.IsAmbiguous(err), "the request went nowhere: %v", err)
			require.Contains(t, err.Error(), connectors.StatusText(answer.Status))
		})
	}
}
