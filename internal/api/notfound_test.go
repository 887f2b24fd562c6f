package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Delivered and canceled intents are deleted after OUTBOX_RETENTION, so a 404 for a key
// a client proposed before does not mean the operation never happened. "no intent has
// key" alone reads as never proposed, and a client that proposes it again has the
// receiver act again.
func TestNotFoundDoesNotReadAsNeverProposed(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "GET", "/v1/intents/order-1", agentSecret, "", "")
	require.Equal(t, http.StatusNotFound, r.status, r.raw)
	require.Equal(t, "not_found", r.errCode(t))
	msg := r.body["error"].(map[string]any)["message"].(string)
	require.Contains(t, msg, `"order-1"`)
	require.Contains(t, msg, "OUTBOX_RETENTION")
	require.Contains(t, msg, "delivered and canceled")
}
