package payment_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The package documentation: in the stored result, "fields Stripe did not send are
// left out". A Refund has no livemode field: a live refund's result must not say
// "livemode": false, which reads as a test-mode refund that moved no money.
func TestDeliver_LivemodeOnlyWhenStripeSendsIt(t *testing.T) {
	t.Parallel()
	url, _ := recordingStripe(t, `{"object":"refund","id":"re_1","status":"succeeded","amount":500,"currency":"usd"}`)
	c := newConnector(t, url)

	raw, err := c.Deliver(t.Context(), delivery("refund:live", `{"operation":"refund.create","params":{"payment_intent":"pi_1","amount":500}}`))
	require.NoError(t, err)
	require.JSONEq(t, `{"object":"refund","id":"re_1","status":"succeeded","amount":500,"currency":"usd"}`, string(raw))
}
