package webhook_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// A connection reset before any byte of the request left (a keep-alive connection the
// receiver or its load balancer timed out) sent nothing: the attempt was reported
// ambiguous ("no readable answer after the request was sent; the receiver may have
// acted"), and a forwarded instance with the hold policy held the row for an operator.
func TestDeliver_ConnectionResetBeforeTheRequestLeftIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	connectortest.DeliverResetBeforeTheRequestLeft(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		func(url string) connectors.Connector {
			c, err := webhook.New(webhook.Config{URL: url + "/hook"}) // the shared transport, as in production
			require.NoError(t, err)
			return c
		}, delivery("warm-up"), delivery("k"))
}

// A receiver that wants a client certificate the connector does not present (outboxd
// serve has none; a library's Config.Client may hold one that expired or is not
// trusted) refuses the TLS handshake, and never read the request: as for a receiver's
// certificate that does not verify, nothing was sent, and the attempt is retried.
func TestDeliver_ClientCertificateRefusedIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	connectortest.DeliverToARefusedHandshake(t, webhook.DefaultTransport(), func(url string, client *http.Client) connectors.Connector {
		c, err := webhook.New(webhook.Config{URL: url + "/hook", Client: client})
		require.NoError(t, err)
		return c
	}, delivery("k"))
}
