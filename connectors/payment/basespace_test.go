package payment_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/payment"
)

// url.Parse keeps a space at the end of a base's path (a stray one in an env file:
// "https://api.stripe.com/v1 "), and the transport puts that path, space and all, in
// front of every request's: each went to /v1%20/v1/payment_intents, which Stripe answers
// 404, and every row went dead on its first attempt.
func TestNew_APIBaseWithWhiteSpaceIsRefused(t *testing.T) {
	t.Parallel()
	for _, base := range []string{"http://127.0.0.1:12111/v1 ", "http://127.0.0.1:12111/ ", " http://127.0.0.1:12111"} {
		c, err := payment.New(payment.Config{APIKey: testKey, APIBase: base})
		require.ErrorContains(t, err, "APIBase: begins or ends with white space", "%q", base)
		require.Nil(t, c)
	}
}
