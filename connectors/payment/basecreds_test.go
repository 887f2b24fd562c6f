package payment_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/payment"
)

// An API base with a user name and password (a proxy's, say) was taken, and shown
// redacted as if it were used, but the credentials were never sent: the API key goes in
// the Authorization header, which net/http then leaves as it is. A proxy that wanted
// them refused every row, each then dead. It is refused, as the Slack connector refuses
// one, and never quoted.
func TestNew_RefusesCredentialsInAPIBase(t *testing.T) {
	t.Parallel()
	for _, base := range []string{"https://proxyuser:S3CRET@stripe.example", "https://proxyuser@stripe.example/stripe"} {
		c, err := payment.New(payment.Config{APIKey: testKey, APIBase: base})
		require.Error(t, err, base)
		require.Nil(t, c)
		require.Contains(t, err.Error(), "payment config: APIBase: must not carry a user name or password", base)
		require.NotContains(t, err.Error(), "S3CRET")
		require.NotContains(t, err.Error(), "proxyuser")
	}
}
