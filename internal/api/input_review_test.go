package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A missing, malformed or unknown connector is an invalid intent (422) whatever the
// token's scope: a scoped token got 403 "may not use connector """, which points at the
// token instead of the request.
func TestBadConnectorIsInvalidForScopedToken(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, body := range []string{
		`{"payload":{}}`,
		`{"connector":"","payload":{}}`,
		`{"connector":"Webhook","payload":{}}`,
		`{"connector":"fax","payload":{}}`,
		`{"connector":"webhook:CRM!","payload":{}}`,
	} {
		for _, secret := range []string{crmSecret, agentSecret, adminSecret} {
			r := b.do(t, "POST", "/v1/intents", secret, "k", body)
			require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s: %s", body, r.raw)
			require.Equal(t, "invalid_intent", r.errCode(t), body)
		}
	}
	require.Equal(t, 0, b.count(t))
	// A well-formed instance outside the token's list is still forbidden.
	r := b.do(t, "POST", "/v1/intents", crmSecret, "k", `{"connector":"webhook:typo","payload":{}}`)
	require.Equal(t, http.StatusForbidden, r.status, r.raw)
}
