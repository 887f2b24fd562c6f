package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// Servers limit the recipients of one message (Gmail 100, Microsoft 365, Postfix's
// smtpd_recipient_limit) and answer a RCPT past the limit "452 4.5.3 too many
// recipients". The connector sends a message to all its recipients or none, so such a row
// can never be delivered: every attempt sends the same RCPTs and gets the same 452. It
// was retried as a passing refusal (25 attempts over about 14 hours by default) before
// going dead, each attempt failing the same way. No retry can change the server's limit:
// the row must fail at once with one clear error.
func TestDeliver_RecipientLimitIsNotRetried(t *testing.T) {
	t.Parallel()
	srv := startServer(t, serverOptions{MaxRecipients: 2})
	c, err := email.New(email.Config{Addr: srv.addr, From: testFrom})
	require.NoError(t, err)
	const payload = `{"to":["a@example.com","b@example.com"],"cc":"c@example.com","subject":"s","text":"x"}`
	for attempt := 1; attempt <= 3; attempt++ {
		d := delivery("rcpt-limit", payload)
		d.Attempt = attempt
		_, err := c.Deliver(t.Context(), d)
		require.Error(t, err)
		require.Zero(t, srv.Effects("rcpt-limit"), "nothing was sent")
		require.Contains(t, err.Error(), "4.5.3")
		require.False(t, connectors.IsAmbiguous(err), "%v", err)
		require.True(t, connectors.IsPermanent(err),
			"attempt %d: the server takes at most 2 recipients in a message and this one has 3; every retry gets the same 452, yet the row is retried: %v", attempt, err)
	}
}
