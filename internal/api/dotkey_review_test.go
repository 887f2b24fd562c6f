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
