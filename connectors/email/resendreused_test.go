package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// Resend answers 409 invalid_idempotent_request when the key was used before with
// another body, and it keeps a key only for a request that sent its email. A row's body
// is the same on every attempt while the connector's configuration is: the answer comes
// when an attempt that sent the email was not recorded as delivered (its answer was lost)
// and the sender was changed before the retry. The email went out under the key, so the
// attempt is final and marked ambiguous: a dead row left unmarked reads as one nothing
// was sent for, and a replay with a new key sends the email a second time.
func TestResendDeliver_KeyUsedForAnotherBodyIsAmbiguous(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	const key, payload = "order-7:receipt", `{"to":"a@example.com","subject":"s","text":"t"}`
	before := newResend(t, f)
	_, err := before.Deliver(t.Context(), delivery(key, payload))
	require.NoError(t, err) // as far as Resend knows; the relay lost this answer
	require.Equal(t, 1, f.Effects(key))

	after, err := email.NewResend(email.ResendConfig{APIKey: f.apiKey, APIBase: f.URL(), From: "Shop Orders <orders@shop.example>"})
	require.NoError(t, err)
	d := delivery(key, payload)
	d.Attempt, d.PreviousAmbiguous = 2, true
	_, err = after.Deliver(t.Context(), d)
	require.Error(t, err)
	require.Contains(t, err.Error(), "invalid_idempotent_request")
	require.True(t, connectors.IsPermanent(err), "a retry sends the same body and gets the same answer: %v", err)
	require.True(t, connectors.IsAmbiguous(err), "Resend sent an email under this key: %v", err)
	require.Equal(t, 1, f.Effects(key))
}
