package payment_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// Stripe's 4xx whose body is lost on the way (the connection drops after the status
// line) is not yet Stripe's answer: the status alone does not tell a card decline,
// which is the key's outcome, from a refused request, and the message that says what to
// fix is in the body. stripe-go, whose own retries the connector turns off, retries such
// a read error whatever the status ("Do retry every other type of non-Stripe error"),
// and a retry with the same key is safe: Stripe replays an answer it saved, or checks a
// request it saved nothing for again. The connector went dead at once instead, with
// "answered 402 Payment Required: unexpected EOF" as the reason.
func TestDeliver_ErrorAnswerCutShortIsRetried(t *testing.T) {
	t.Parallel()
	const (
		decline = `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds.","charge":"ch_1"}}`
		invalid = `{"error":{"type":"invalid_request_error","code":"amount_too_small","param":"amount","message":"Amount must be at least $0.50 usd"}}`
	)
	for _, tc := range []struct {
		name   string
		status int
		body   string
		// The retry's answer in full.
		result    string // a stored outcome, or
		permanent string // a permanent failure saying this
	}{
		{name: "CardDecline", status: http.StatusPaymentRequired, body: decline,
			result: `{"object":"error","type":"card_error","code":"card_declined","decline_code":"insufficient_funds",
				"message":"Your card has insufficient funds.","charge":"ch_1","request_id":"req_fake"}`},
		{name: "InvalidRequest", status: http.StatusBadRequest, body: invalid, permanent: "Amount must be at least $0.50 usd (amount_too_small)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			key := "cut-body:" + tc.name
			b.f.Plan(key,
				action{Status: tc.status, Body: tc.body, CutBody: true},
				action{Status: tc.status, Header: http.Header{"Idempotent-Replayed": {"true"}}, Body: tc.body})

			raw, err := b.c.Deliver(t.Context(), delivery(key, createPI))
			require.Error(t, err)
			require.Nil(t, raw, "no answer of Stripe's to store")
			require.False(t, connectors.IsPermanent(err), "the status line alone is not Stripe's answer: %v", err)
			require.Contains(t, err.Error(), "Stripe answered "+connectors.StatusText(tc.status))
			require.Contains(t, err.Error(), "the connection dropped before the rest of the answer")

			d := delivery(key, createPI)
			d.Attempt = 2
			raw, err = b.c.Deliver(t.Context(), d)
			if tc.result != "" {
				require.NoError(t, err)
				require.JSONEq(t, tc.result, string(raw))
			} else {
				require.True(t, connectors.IsPermanent(err), "%v", err)
				require.Contains(t, err.Error(), tc.permanent)
			}
			require.Len(t, b.f.Requests(key), 2)
		})
	}
}
