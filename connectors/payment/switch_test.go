package payment_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/payment"
)

// An answer of 101 Switching Protocols hands its connection over as its body, which the
// attempt's timeout no longer bounds (net/http gives it to the caller). stripe-go reads
// every answer's body, so Deliver waited for the server to hang up, past its timeout
// and its row's lease; the webhook connector had been fixed for this, payment had not.
// It is now a permanent answer, classified by its status.
func TestDeliver_SwitchingProtocols(t *testing.T) {
	t.Parallel()
	// Generous for a busy machine, and still well short of the helper's watchdog, which a
	// Deliver that reads the handed-over connection reaches whatever the timeout.
	_, err2 := connectortest.DeliverAfterProtocolSwitch(t, func(url string) connectors.Connector {
		c, err := payment.New(payment.Config{APIKey: testKey, APIBase: url, Timeout: 10 * time.Second, HTTPClient: &http.Client{}})
		require.NoError(t, err)
		return c
	}, delivery("k", createPI))
	require.True(t, connectors.IsPermanent(err2), "%v", err2)
	require.False(t, connectors.IsAmbiguous(err2), "%v", err2)
	require.Contains(t, err2.Error(), "101 Switching Protocols")
}
