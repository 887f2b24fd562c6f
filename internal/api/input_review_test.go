package api_test

import (
	"io"
	"net/http"
	"strings"
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

// A reason holding a NUL character, which PostgreSQL's text cannot store, is a bad
// request (400) that decides nothing: it failed the audit insert, and the API answered
// 500 internal.
func TestDecideReasonWithNULIsBadRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, key := range []string{"pay-1", "pay-2", "pay-3"} {
		r := b.do(t, "POST", "/v1/intents", agentSecret, key, `{"connector":"payment","payload":`+paymentPayload+`}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
	}
	for key, action := range map[string]string{"pay-1": "approve", "pay-2": "reject", "pay-3": "cancel"} {
		r := b.do(t, "POST", "/v1/intents/"+key+"/"+action, adminSecret, "", `{"reason":"a\u0000b"}`)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", action, r.raw)
		require.Equal(t, "bad_request", r.errCode(t), action)
		r = b.do(t, "GET", "/v1/intents/"+key, adminSecret, "", "")
		require.Equal(t, "awaiting_approval", r.body["status"], action)
	}
	var audits int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_audit`).Scan(&audits))
	require.Zero(t, audits)
}

// A connector filter that names no connector instance (a NUL, bytes that are not UTF-8,
// capitals) is a bad filter (400): the first two reached PostgreSQL, which refused the
// text, and the API answered 500 internal.
func TestListBadConnectorFilterIsBadRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, q := range []string{"%00", "%FF", "webhook%00", "Webhook", "webhook:*x"} {
		for _, secret := range []string{adminSecret, agentSecret} {
			r := b.do(t, "GET", "/v1/intents?connector="+q, secret, "", "")
			require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", q, r.raw)
			require.Equal(t, "invalid_filter", r.errCode(t), q)
		}
	}
}

// A route that exists answers another method with 405 and Allow (the JSON error
// shape), as net/http's mux would without the API's catch-all, which answered 404
// "no such route" for GET /v1/intents/k/approve or DELETE /v1/intents/k.
func TestWrongMethodIs405(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for path, tc := range map[string]struct{ method, allow string }{
		"/v1/intents":           {"DELETE", "GET, HEAD, POST"},
		"/v1/intents/k":         {"DELETE", "GET, HEAD"},
		"/v1/intents/k/approve": {"GET", "POST"},
		"/v1/intents/k/cancel":  {"PUT", "POST"},
	} {
		r := b.do(t, tc.method, path, adminSecret, "", "")
		require.Equal(t, http.StatusMethodNotAllowed, r.status, "%s %s: %s", tc.method, path, r.raw)
		require.Equal(t, "method_not_allowed", r.errCode(t))
		require.Equal(t, tc.allow, r.header.Get("Allow"), path)
	}
	r := b.do(t, "GET", "/v1/nothing", adminSecret, "", "")
	require.Equal(t, http.StatusNotFound, r.status, r.raw)
	require.Empty(t, r.header.Get("Allow"))
}

// A 405 or 404 names the path as the client sent it: POST /v1/intents/k%2Fapprove
// reads the intent "k/approve", which takes GET, and its 405 said "POST is not allowed
// on /v1/intents/k/approve; use GET, HEAD", naming the approve route, which takes POST.
func TestWrongMethodNamesEscapedPath(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "POST", "/v1/intents/k%2Fapprove", adminSecret, "", "")
	require.Equal(t, http.StatusMethodNotAllowed, r.status, r.raw)
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
	require.Equal(t, "POST is not allowed on /v1/intents/k%2Fapprove; use GET, HEAD",
		r.body["error"].(map[string]any)["message"])
	r = b.do(t, "GET", "/v1/intents/k%2Fapprove/x", adminSecret, "", "")
	require.Equal(t, http.StatusNotFound, r.status, r.raw)
	require.Equal(t, "no such route: GET /v1/intents/k%2Fapprove/x", r.body["error"].(map[string]any)["message"])
}

// A limit past the largest int is a large page, as a limit of 10000 is (capped at the
// largest page): it answered 400 "limit must be a positive integer", which it is.
func TestHugeListLimitIsCapped(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, l := range []string{"10000", "9223372036854775807", "9223372036854775808", "100000000000000000000000"} {
		r := b.do(t, "GET", "/v1/intents?limit="+l, adminSecret, "", "")
		require.Equal(t, http.StatusOK, r.status, "%s: %s", l, r.raw)
	}
	for _, l := range []string{"0", "-1", "-9223372036854775809", "1.5", "x"} {
		r := b.do(t, "GET", "/v1/intents?limit="+l, adminSecret, "", "")
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", l, r.raw)
		require.Contains(t, r.raw, "limit must be a positive integer", l)
		require.Contains(t, r.raw, "at most 1000", l)
	}
}

// Two Idempotency-Key headers name no one operation: 400, nothing written. The API
// took the first and ignored the other, so the row's key depended on header order.
func TestTwoIdempotencyKeysAreBadRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	req, err := http.NewRequestWithContext(t.Context(), "POST", b.url+"/v1/intents",
		strings.NewReader(`{"connector":"webhook","payload":{}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+agentSecret)
	req.Header.Add("Idempotency-Key", "first")
	req.Header.Add("Idempotency-Key", "second")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusBadRequest, res.StatusCode, string(raw))
	require.Contains(t, string(raw), `"bad_request"`)
	require.Equal(t, 0, b.count(t))
}

// A body that is JSON but not an object ("null") is a bad request (400), as "[]" and
// "1" are: the decoder took null as an empty request, answered 422 about a missing
// connector, and the decide routes took it as no reason.
func TestNullBodyIsBadRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, body := range []string{"null", " null ", "[]", "1"} {
		r := b.do(t, "POST", "/v1/intents", adminSecret, "k", body)
		require.Equal(t, http.StatusBadRequest, r.status, "%q: %s", body, r.raw)
		require.Equal(t, "bad_request", r.errCode(t))
	}
	require.Equal(t, 0, b.count(t))
	r := b.do(t, "POST", "/v1/intents", agentSecret, "pay", `{"connector":"payment","payload":`+paymentPayload+`}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	r = b.do(t, "POST", "/v1/intents/pay/approve", adminSecret, "", "null")
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
	r = b.do(t, "GET", "/v1/intents/pay", adminSecret, "", "")
	require.Equal(t, "awaiting_approval", r.body["status"])
}

// Field names match exactly, as MCP's schema and the payload checks match them: Go's
// decoder took "Connector" or "PAYLOAD" for the documented fields (the last of two
// such wins), so a body could name one field twice and be read as either.
func TestFieldNamesMatchExactly(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, body := range []string{
		`{"Connector":"webhook","payload":{}}`,
		`{"connector":"webhook","payload":{"a":1},"PAYLOAD":{"a":2}}`,
		`{"connector":"webhook","payload":{},"Ordering_Key":"x"}`,
	} {
		r := b.do(t, "POST", "/v1/intents", adminSecret, "k", body)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r.raw)
		require.Equal(t, "bad_request", r.errCode(t))
	}
	require.Equal(t, 0, b.count(t))
	r := b.do(t, "POST", "/v1/intents", adminSecret, "k", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	r = b.do(t, "POST", "/v1/intents/k/cancel", adminSecret, "", `{"Reason":"x"}`)
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
}

// A not_before that is not an RFC 3339 time is a bad request whose message names the
// field: it said only `parsing time "tomorrow" as "2006-01-02T15:04:05Z07:00"`.
func TestBadNotBeforeNamesTheField(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "POST", "/v1/intents", adminSecret, "k", `{"connector":"webhook","payload":{},"not_before":"tomorrow"}`)
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
	require.Contains(t, r.raw, `field \"not_before\": parsing time \"tomorrow\"`)
	require.Equal(t, 0, b.count(t))
}
