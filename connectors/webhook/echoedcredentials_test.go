package webhook_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/webhook"
)

// TestDeliver_AnswerEchoingBasicCredentialsDoesNotShowThem: a URL's user name and
// password go to the receiver as HTTP Basic authentication, "Basic " and the base64 of
// "user:password", which anyone decodes. A receiver that repeats the request's
// Authorization header in its answer (a 401 page that says what it got, an echo or
// debugging endpoint, a gateway's error) put them in last_error and the stored result,
// which the intent API shows to agents, though the password itself is replaced there.
func TestDeliver_AnswerEchoingBasicCredentialsDoesNotShowThem(t *testing.T) {
	t.Parallel()
	const user, password = "hook-user", "s3cretPassw0rd"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, "invalid credentials: Authorization: %s", r.Header.Get("Authorization"))
	}))
	t.Cleanup(srv.Close)
	target := strings.Replace(srv.URL, "http://", "http://"+user+":"+password+"@", 1) + "/hook"
	c, err := webhook.New(webhook.Config{URL: target, Client: testClient(t)})
	require.NoError(t, err)

	raw, err := c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	encoded := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	require.NotContains(t, err.Error(), encoded, "last_error shows the URL's credentials, base64-encoded")
	require.NotContains(t, string(raw), encoded, "the stored result shows the URL's credentials, base64-encoded")
	require.NotContains(t, err.Error(), password)
}

// TestDeliver_AnswerCutInTheURLsTokenDoesNotShowItsStart: the stored result keeps the
// answer's first MaxResultBody bytes (1024), and the parts of the URL an answer repeats
// are replaced in those bytes only after the cut. A long error page (a framework's
// debug 404, a gateway's HTML) that repeats the path across the cut kept the token's
// start, all of it but the bytes past the cut, in the stored result.
func TestDeliver_AnswerCutInTheURLsTokenDoesNotShowItsStart(t *testing.T) {
	t.Parallel()
	const token = "T0KENs3cret9zQ4mW7pL2vX8"
	// Bytes of the path before the cut: "/hooks/catch/" and all of the token but its last
	// two characters.
	const cutAfter = len("/hooks/catch/") + len(token) - 2
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		// The page's styles, then the path: the default 1024-byte excerpt ends inside it.
		fmt.Fprintf(w, "%s<p>Page not found: POST %s</p>", strings.Repeat(" ", 1024-len("<p>Page not found: POST ")-cutAfter), r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	c, err := webhook.New(webhook.Config{URL: srv.URL + "/hooks/catch/" + token, Client: testClient(t)})
	require.NoError(t, err)

	raw, err := c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	require.Contains(t, string(raw), `"truncated":true`)
	require.NotContains(t, string(raw), token[:3], "the stored result shows the start of the URL's token")
}
