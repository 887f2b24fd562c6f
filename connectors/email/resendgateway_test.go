package email_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// A 502 or 504 is a gateway's answer for Resend: it passed the request on and then lost
// Resend's connection (502) or stopped waiting for its answer (504), so Resend may have
// sent the email, as after a connection reset of its own (the webhook connector classes
// them so). It was a plain retryable failure, so a row whose last attempt met one ended
// dead unmarked, as if nothing had been sent.
func TestResendDeliver_GatewayAnswerIsAmbiguous(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	for _, status := range []int{http.StatusBadGateway, http.StatusGatewayTimeout} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			key := fmt.Sprintf("gateway:%d", status)
			f.Script(key, status, nil, `<html>gateway</html>`)
			_, err := c.Deliver(t.Context(), delivery(key, `{"to":"a@example.com","subject":"s","text":"t"}`))
			require.Error(t, err)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.True(t, connectors.IsAmbiguous(err), "Resend may have sent the email behind the gateway: %v", err)
		})
	}
}

// All of Resend's API traffic comes through Cloudflare, which forwards it to Resend's
// own servers (Resend's incident report of November 18, 2025), and Cloudflare answers
// for an origin that took a request and then reset the connection or answered nothing
// with 520, and for one that did not answer in time with 524: its 502 and 504, which
// the webhook connector classes as such. They were plain retryable failures here, so a
// row whose last attempt met one ended dead unmarked, as if nothing had been sent.
// Cloudflare's 521, 522 and 523 say it never reached the origin: not ambiguous.
func TestResendDeliver_CloudflareLostAnswerIsAmbiguous(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	for _, status := range []int{520, 521, 522, 523, 524} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			key := fmt.Sprintf("cloudflare:%d", status)
			f.Script(key, status, nil, `<html>cloudflare</html>`)
			_, err := c.Deliver(t.Context(), delivery(key, `{"to":"a@example.com","subject":"s","text":"t"}`))
			require.Error(t, err)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			lost := status == 520 || status == 524
			require.Equal(t, lost, connectors.IsAmbiguous(err), "%v", err)
		})
	}
}
