package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// Resend answered 2xx, so it took the email, but the answer (its id) was lost. The
// attempt's effect is not known from what came back, as for a dropped connection after
// the request was written: it is ambiguous (and retried with the same key, for which
// Resend returns its stored answer), so that a row that ends there is marked as one that
// may have been sent.
func TestResendDeliver_UnreadableSuccessIsAmbiguous(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	const key, payload = "unreadable", `{"to":"a@example.com","subject":"s","text":"t"}`
	f.Script(key, 200, nil, `{"object":"email"}`)

	raw, err := c.Deliver(t.Context(), delivery(key, payload))
	require.Error(t, err)
	require.Nil(t, raw)
	require.True(t, connectors.IsAmbiguous(err), "Resend answered 200 and may have sent the email: %v", err)
	require.False(t, connectors.IsPermanent(err), "%v", err)
}
