package email_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/email"
)

// An answer of 101 Switching Protocols hands its connection over as its body, which the
// attempt's timeout no longer bounds (net/http gives it to the caller). Deliver read it
// for Resend's error, and so waited for the server to hang up, past its timeout and its
// row's lease; the webhook connector had been fixed for this, Resend had not. It is
// now a permanent answer, classified by its status.
func TestResendDeliver_SwitchingProtocols(t *testing.T) {
	t.Parallel()
	// Generous for a busy machine, and still well short of the helper's watchdog, which a
	// Deliver that reads the handed-over connection reaches whatever the timeout.
	raw, err := connectortest.DeliverAfterProtocolSwitch(t, func(url string) connectors.Connector {
		c, err := email.NewResend(email.ResendConfig{APIKey: "re_x", APIBase: url, From: testFrom, Timeout: 10 * time.Second})
		require.NoError(t, err)
		return c
	}, delivery("k", `{"to":"a@example.com","subject":"s","text":"t"}`))
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "Resend answered 101 Switching Protocols")
	var res email.ResendResult
	if raw != nil {
		res = decodeResendResult(t, raw)
	}
	require.Equal(t, http.StatusSwitchingProtocols, res.Status)
}
