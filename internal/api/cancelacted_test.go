package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// POST /v1/intents/{key}/cancel answered a held intent, or a pending one, after an
// attempt that may have reached the receiver exactly as one never sent: "canceled",
// though the receiver may have acted already. The answer now says so, and why; the
// intent is canceled all the same, and one never attempted gets no such field.
func TestCancelAnswerSaysTheReceiverMayHaveActed(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, key := range []string{"held", "reclaimed", "fresh"} {
		r := b.do(t, "POST", "/v1/intents", adminSecret, key, `{"connector":"webhook","payload":{}}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
	}
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'held', ambiguous = true, attempts = 1 WHERE idempotency_key = 'held'`)
	require.NoError(t, err)
	// Reclaimed after its relay's lease expired mid-attempt: pending, marked ambiguous.
	_, err = b.pool.Exec(t.Context(), `UPDATE outbox SET ambiguous = true, attempts = 1 WHERE idempotency_key = 'reclaimed'`)
	require.NoError(t, err)

	for _, key := range []string{"held", "reclaimed"} {
		r := b.do(t, "POST", "/v1/intents/"+key+"/cancel", adminSecret, "", `{"reason":"order refunded"}`)
		require.Equal(t, http.StatusOK, r.status, r.raw)
		require.Equal(t, "canceled", r.body["status"], r.raw)
		acted, ok := r.body["may_have_acted"].(map[string]any)
		require.True(t, ok, "%s: %s", key, r.raw)
		require.Equal(t, "webhook", acted["connector"], r.raw)
		require.Contains(t, acted["reason"], "may have reached the receiver", r.raw)

		// Sent again (the first answer lost), it says so again.
		r = b.do(t, "POST", "/v1/intents/"+key+"/cancel", adminSecret, "", "")
		require.Equal(t, http.StatusOK, r.status, r.raw)
		require.Contains(t, r.body, "may_have_acted", r.raw)
		again := r.body["may_have_acted"]

		// And so does every read of the intent: GET, the list and the same request POSTed
		// again answered "canceled" alone, which reads as an operation that never happened.
		r = b.do(t, "GET", "/v1/intents/"+key, adminSecret, "", "")
		require.Equal(t, http.StatusOK, r.status, r.raw)
		require.Equal(t, again, r.body["may_have_acted"], r.raw)
		agree(t, b, adminSecret, r, true)
	}

	r := b.do(t, "POST", "/v1/intents/fresh/cancel", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "canceled", r.body["status"], r.raw)
	require.NotContains(t, r.body, "may_have_acted", r.raw)
	require.Equal(t, "fresh", r.body["key"], "the intent's fields as before")
	r = b.do(t, "GET", "/v1/intents/fresh", adminSecret, "", "")
	require.NotContains(t, r.body, "may_have_acted", r.raw)
	agree(t, b, adminSecret, r, true)
}

// A dead intent an attempt of which may have reached the receiver (one timed out, the
// retries after it refused) read as a failed operation: "dead" alone, in GET, the list and
// the same request POSTed again, and a client acts again under a new key, where the
// receiver may have performed the first. Every read now carries may_have_acted for it, as
// for a canceled one; a dead intent whose attempts all failed plainly gets none.
func TestDeadAfterAnAttemptThatMayHaveReachedSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, key := range []string{"dead-reached", "dead-refused"} {
		r := b.do(t, "POST", "/v1/intents", adminSecret, key, `{"connector":"webhook","payload":{}}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
	}
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead', attempts = 2, last_error = 'attempt 2: 400'
		WHERE idempotency_key IN ('dead-reached', 'dead-refused')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
SELECT id, n, 'r1', now(), now(), CASE WHEN n = 1 AND idempotency_key = 'dead-reached' THEN 'retry' ELSE 'dead' END,
       n = 1 AND idempotency_key = 'dead-reached', 'timeout'
FROM outbox, generate_series(1, 2) AS n WHERE idempotency_key IN ('dead-reached', 'dead-refused')`)
	require.NoError(t, err)

	r := b.do(t, "GET", "/v1/intents/dead-reached", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	acted, ok := r.body["may_have_acted"].(map[string]any)
	require.True(t, ok, r.raw)
	require.Equal(t, "webhook", acted["connector"], r.raw)
	require.Contains(t, acted["reason"], "dead after an attempt that may have reached the receiver", r.raw)
	agree(t, b, adminSecret, r, true)

	r = b.do(t, "GET", "/v1/intents/dead-refused", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.body, "may_have_acted", r.raw)
	agree(t, b, adminSecret, r, true)
}
