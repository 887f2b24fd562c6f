package payment_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
)

// New's doc: "an error naming the field that is wrong". An API key with a control
// character cannot go in an Authorization header: New took it, and every attempt of
// every row then failed with "the request could not be sent: net/http: invalid header
// field value" as a retryable error, each row retried to dead. (outboxd's configuration
// refuses such a key; a program that embeds the relay builds the connector itself.)
func TestNew_APIKeyWithControlCharacter(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	for _, key := range []string{"sk_test_12\x003", "sk_test_12\x7f3", "sk_test_12\x1b3"} {
		c, err := payment.New(payment.Config{APIKey: key, APIBase: f.URL()})
		if err == nil {
			_, derr := c.Deliver(t.Context(), delivery("control-key", createPI))
			t.Fatalf("New took an API key with a control character (%q); Deliver: permanent=%t: %v",
				key, connectors.IsPermanent(derr), derr)
		}
		require.Contains(t, err.Error(), "payment config: APIKey: has control characters")
		require.NotContains(t, err.Error(), "sk_test_12")
	}
}
