package payment_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The README's OUTBOX_PAYMENT_API_BASE is the "base URL of the Stripe API, for a proxy or
// stripe-mock", and connectors.ParseAPIBase takes one with a path ("request paths are
// appended to it"). stripe-go reads an answer only when its request's path begins with
// /v1: under a base with a path of its own (https://proxy.example/stripe) the connector
// sent each request, so Stripe acted, and then failed it with "unknown path prefix
// /stripe/v1/customers" without reading the answer. Every attempt was ambiguous, and the
// row was retried until dead although Stripe had done the work.
func TestDeliver_APIBaseWithPath(t *testing.T) {
	t.Parallel()
	url, take := recordingStripe(t, `{"object":"customer","id":"cus_1","livemode":false}`)
	for base, want := range map[string]string{
		"/stripe":     "/stripe/v1/customers",
		"/stripe/":    "/stripe/v1/customers",
		"/stripe/v1/": "/stripe/v1/customers", // stripe-go drops a final /v1 from a base
		"/v1":         "/v1/customers",
		"/a%2Fb":      "/a%2Fb/v1/customers",
		"/a%2F":       "/a%2F/v1/customers",
	} {
		c := newConnector(t, url+base)
		raw, err := c.Deliver(t.Context(), delivery("base-path", `{"operation":"customer.create","params":{"email":"jane@example.com"}}`))
		require.NoError(t, err, "base %s", base)
		require.JSONEq(t, `{"object":"customer","id":"cus_1","livemode":false}`, string(raw))
		uris, _ := take()
		require.Equal(t, []string{want}, uris, "base %s", base)
	}
}
