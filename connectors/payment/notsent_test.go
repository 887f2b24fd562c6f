package payment_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/payment"
)

const customerCreate = `{"operation":"customer.create","params":{"email":"jane@example.com"}}`

// An attempt that sent Stripe nothing is not ambiguous (README, "Proxies and
// certificates"): the connector called every failure after it had a connection
// ambiguous ("Stripe may have acted"), so such a row, dead after its last attempt,
// showed may_have_acted, and replay and cancel warned that Stripe may have acted.
func TestConnectionResetBeforeTheRequestLeftIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	const answer = `{"object":"customer","id":"cus_1","livemode":false}`
	connectortest.DeliverResetBeforeTheRequestLeft(t,
		fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer),
		func(url string) connectors.Connector {
			c, err := payment.New(payment.Config{APIKey: testKey, APIBase: url}) // the shared transport
			require.NoError(t, err)
			return c
		}, delivery("warm-up", customerCreate), delivery("k", customerCreate))
}

func TestClientCertificateRefusedIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	connectortest.DeliverToARefusedHandshake(t, payment.DefaultTransport(), func(url string, client *http.Client) connectors.Connector {
		c, err := payment.New(payment.Config{APIKey: testKey, APIBase: url, HTTPClient: client})
		require.NoError(t, err)
		return c
	}, delivery("k", customerCreate))
}
