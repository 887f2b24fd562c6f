package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A key of "." or ".." cannot be named in a path: the server cleans /v1/intents/.. to
// /v1/, so GET, approve, reject and cancel answer 404 for an intent that exists. The API
// refuses such a key when the intent is created, before anything is written.
func TestDotKeysAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, key := range []string{".", ".."} {
		r := b.do(t, "POST", "/v1/intents", adminSecret, key, `{"connector":"webhook","payload":{}}`)
		require.Equal(t, http.StatusBadRequest, r.status, "%q: %s", key, r.raw)
		require.Equal(t, "bad_request", r.errCode(t))
	}
	require.Zero(t, b.count(t))
	r := b.do(t, "POST", "/v1/intents", adminSecret, "...", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	r = b.do(t, "GET", "/v1/intents/...", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
}

// An intent written under such a key before the rule (by an older outboxd, or plain SQL)
// is still the answer to its request: the API answered 400 "use another key", and a
// client that retried a performed effect under a new key had it performed again.
func TestDotKeyWrittenBeforeIsTheIntent(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	_, err := b.pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, delivered_at, attempts)
VALUES ('.', 'webhook', '{"n": 1}', 'delivered', now(), 1)`)
	require.NoError(t, err)
	r := b.do(t, "POST", "/v1/intents", adminSecret, ".", `{"connector":"webhook","payload":{"n":1}}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	require.Equal(t, "delivered", r.body["status"], r.raw)

	// Another request under it is the key's conflict, and a key no intent holds is
	// refused as before, with nothing written.
	r = b.do(t, "POST", "/v1/intents", adminSecret, ".", `{"connector":"webhook","payload":{"n":2}}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, r.raw)
	require.Equal(t, "key_conflict", r.errCode(t))
	r = b.do(t, "POST", "/v1/intents", adminSecret, "..", `{"connector":"webhook","payload":{"n":1}}`)
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
	require.Contains(t, r.raw, "use another key")
	require.Equal(t, 1, b.count(t))
}
