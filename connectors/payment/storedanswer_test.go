package payment_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// Stripe stores the answer of a request that began to run against its key, failures
// included, and replays it ("A request that returns a 400 sends back the same 400 if
// followed by a new request with the same idempotency key"). That answer is the key's
// outcome, so Deliver returns it with the error for the relay to store, as it does for
// a card decline: its status, Stripe's error fields and the request id to quote to
// Stripe's support.
func TestDeliver_StripeErrorAnswerIsStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "order-11:charge"
	b.f.Plan(key, action{Status: http.StatusBadRequest, Header: http.Header{"Idempotent-Replayed": {"true"}},
		Body: `{"error":{"type":"invalid_request_error","code":"amount_too_small","param":"amount","message":"Amount must be at least $0.50 usd"}}`})

	raw, err := b.c.Deliver(t.Context(), delivery(key, createPI))
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.NotNil(t, raw, "Stripe's stored answer for the key is not kept")
	require.JSONEq(t, `{"object":"error","status":400,"type":"invalid_request_error","code":"amount_too_small",
		"param":"amount","message":"Amount must be at least $0.50 usd","request_id":"req_fake","idempotent_replayed":true}`, string(raw))
	require.NotContains(t, string(raw), testKey)
}

// Stripe saves no answer for a request that did not begin to run: one refused because
// another with the same key is still running (409), or rate limited (429). Such an
// answer is not the key's outcome, so it must not be returned for the relay to store:
// the relay keeps a result across later attempts that bring none (result =
// coalesce(new, old)), and a row that then dies after a timeout would show "409
// idempotency_error" as Stripe's stored answer for a key whose first request may have
// succeeded.
func TestDeliver_TransientStripeAnswerIsNotStored(t *testing.T) {
	t.Parallel()
	for name, a := range map[string]action{
		"Conflict":        {Status: http.StatusConflict, Body: `{"error":{"type":"idempotency_error","message":"There is currently another in-progress request using this Idempotent Key."}}`},
		"TooManyRequests": {Status: http.StatusTooManyRequests, Body: `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests."}}`},
		// A 5xx marked to retry: Stripe says a retry can do the work, so it saved nothing.
		"ServerErrorShouldRetry": {Status: http.StatusServiceUnavailable, Header: http.Header{"Stripe-Should-Retry": {"true"}},
			Body: `{"error":{"type":"api_error","message":"Stripe is temporarily unavailable."}}`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			key := "review:" + name
			b.f.Plan(key, a)
			raw, err := b.c.Deliver(t.Context(), delivery(key, createPI))
			require.Error(t, err)
			require.False(t, connectors.IsPermanent(err))
			require.Nil(t, raw, "a transient answer is stored as the key's outcome: %s", raw)
		})
	}
}
