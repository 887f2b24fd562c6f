package email_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/email"
)

// An answer that repeats the request's Authorization header (a proxy's error page, a
// stand-in at OUTBOX_EMAIL_API_BASE that says what it got) must not put the Resend API
// key in the row's result and last_error, which the intent API and MCP show to agents.
func TestResendDeliver_AnswerEchoingTheAPIKeyDoesNotShowIt(t *testing.T) {
	t.Parallel()
	const key = "re_live_s3cretKey0123456789"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte("refused: Authorization was '" + r.Header.Get("Authorization") + "'"))
	}))
	t.Cleanup(srv.Close)
	c, err := email.NewResend(email.ResendConfig{APIKey: key, APIBase: srv.URL, From: testFrom})
	require.NoError(t, err)

	raw, err := c.Deliver(t.Context(), delivery("k-echo", `{"to":"a@example.com","subject":"s","text":"t"}`))
	require.Error(t, err)
	require.Contains(t, err.Error(), "401")
	require.Contains(t, err.Error(), "xxxxx", "the key's place is shown")
	require.NotContains(t, err.Error(), key, "last_error shows the API key")
	require.NotContains(t, string(raw), key, "the stored result shows the API key")
}
