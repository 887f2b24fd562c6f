package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// Receivers take credentials in headers of their own as often as in Authorization: an
// API gateway's X-Api-Key, an Azure Function's X-Functions-Key, GitLab's Private-Token.
// Such a row header was returned in clear to any token that may read the connector's
// intents, which lets an agent call the receiver past the outbox, as an Authorization
// header would (TestRowCredentialsNotReturned).
func TestRowAPIKeyHeadersNotReturned(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	headers := map[string]string{
		"x-api-key":        "s3cret-api-key",
		"x-functions-key":  "s3cret-functions-key",
		"private-token":    "s3cret-private-token",
		"x-auth-token":     "s3cret-auth-token",
		"x-webhook-secret": "s3cret-webhook-secret",
		"traceparent":      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	_, err := outbox.Enqueue(t.Context(), b.pool, outbox.Message{
		Key: "app-1", Connector: "webhook:crm", Payload: map[string]any{"n": 1}, Headers: headers,
	})
	require.NoError(t, err)

	r := b.do(t, "GET", "/v1/intents/app-1", crmSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.raw, "s3cret")
	require.Contains(t, r.raw, "0af7651916cd43dd8448eb211c80319c") // harmless headers stay
}
