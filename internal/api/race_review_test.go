package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A cancel that meets an approval in progress (approve and reject hold the row for their
// transaction) is refused for the moment; the answer must not blame a relay, which never
// holds a row awaiting approval.
func TestCancelDuringApprovalDoesNotBlameARelay(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "POST", "/v1/intents", agentSecret, "pay-1", `{"connector":"payment","payload":`+paymentPayload+`}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	require.Equal(t, "awaiting_approval", r.body["status"])

	// An approval in progress: ops.Approve's transaction holds the row FOR UPDATE.
	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(t.Context()) })
	var id int64
	require.NoError(t, tx.QueryRow(t.Context(), `SELECT id FROM outbox WHERE idempotency_key = 'pay-1' FOR UPDATE`).Scan(&id))

	r = b.do(t, "POST", "/v1/intents/pay-1/cancel", adminSecret, "", "")
	require.Equal(t, http.StatusConflict, r.status, r.raw)
	msg := r.body["error"].(map[string]any)["message"].(string)
	require.NotContains(t, msg, "a relay is recording", msg)
	require.Contains(t, msg, "approve", msg)
	require.NoError(t, tx.Rollback(t.Context()))

	r = b.do(t, "POST", "/v1/intents/pay-1/cancel", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "canceled", r.body["status"])
}
