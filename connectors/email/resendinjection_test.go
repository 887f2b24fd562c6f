package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// Over SMTP, go-mail encodes the subject and display names (RFC 2047), so a line break
// in them cannot end their header. Resend got them as the row held them: a subject, or
// an address whose comment (which net/mail takes) held a line break and a second header,
// went out as written, for Resend to turn into header lines, while the same control
// characters in the payload's own headers were refused.
func TestResendDeliver_ControlCharactersInHeaderFieldsAreRefused(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	for name, payload := range map[string]string{
		"Subject": `{"to":"a@example.com","subject":"Your order\r\nBcc: evil@example.com","text":"t"}`,
		"To":      `{"to":"a@example.com (Ann\nBcc: evil@example.com)","subject":"s","text":"t"}`,
		"Cc":      `{"to":"a@example.com","cc":["b@example.com (Bob\r\nBcc: evil@example.com)"],"subject":"s","text":"t"}`,
		"ReplyTo": `{"to":"a@example.com","reply_to":"r@example.com (R\u0000)","subject":"s","text":"t"}`,
	} {
		t.Run(name, func(t *testing.T) { // not parallel: the check below runs after them
			_, err := c.Deliver(t.Context(), delivery("injection:"+name, payload))
			require.Error(t, err)
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), "control characters")
		})
	}
	require.Empty(t, f.Requests(), "refused before sending")
}
