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

// Rejecting an intent past approval is refused; the refusal may point to cancel only
// where cancel would act (pending, held), not at an intent delivered, dead or in flight,
// which cancel refuses too.
func TestRejectPastApprovalAdvisesOnlyWhatWorks(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for status, advise := range map[string]bool{"pending": true, "held": true, "delivered": false, "dead": false} {
		key := "k-" + status
		r := b.do(t, "POST", "/v1/intents", adminSecret, key, `{"connector":"webhook","payload":{}}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
		_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = $2 WHERE idempotency_key = $1`, key, status)
		require.NoError(t, err)

		r = b.do(t, "POST", "/v1/intents/"+key+"/reject", adminSecret, "", "")
		require.Equal(t, http.StatusConflict, r.status, r.raw)
		msg := r.body["error"].(map[string]any)["message"].(string)
		c := b.do(t, "POST", "/v1/intents/"+key+"/cancel", adminSecret, "", "")
		require.Equal(t, advise, c.status == http.StatusOK, "%s: cancel answered %s", status, c.raw)
		if advise {
			require.Contains(t, msg, "cancel it", status)
		} else {
			require.NotContains(t, msg, "cancel it", "%s: %s", status, msg)
		}
	}
}
