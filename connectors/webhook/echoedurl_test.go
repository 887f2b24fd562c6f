package webhook_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/webhook"
)

// The connector shows a URL by its scheme and host only ("https://host/xxxxx"): webhook
// URLs carry their token in the path (Slack's /services/T…/B…/<token>, Zapier's
// /hooks/catch/…) or the query, and last_error reaches agents through the intent API.
// A redirect's Location is redacted for the same reason. But the error also quotes the
// answer's body, and common servers echo the request path or the redirect target there:
// Express answers an unknown route "Cannot POST /path" and res.redirect "Found.
// Redirecting to <url>", Rails "You are being <a href=…>redirected</a>". The token then
// reached last_error (and the stored result) in full.
func TestDeliver_AnswerEchoingTheURLDoesNotShowItsToken(t *testing.T) {
	t.Parallel()
	const token = "T0KENs3cret9z"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/moved/" + token:
			// Express's res.redirect, e.g. a trailing-slash or http-to-https rule.
			loc := "http://" + r.Host + r.URL.RequestURI() + "/"
			w.Header().Set("Location", loc)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusMovedPermanently)
			fmt.Fprintf(w, "Moved Permanently. Redirecting to %s", loc)
		default:
			// Express's finalhandler for a route it does not have.
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Error</title>\n</head>\n<body>\n<pre>Cannot POST %s</pre>\n</body>\n</html>\n", r.URL.Path)
		}
	}))
	t.Cleanup(srv.Close)

	for _, target := range []string{
		srv.URL + "/hooks/catch/" + token,             // a token in the path
		srv.URL + "/hook?token=" + token,              // a token in the query
		srv.URL + "/moved/" + token + "?sig=" + token, // a redirect repeating both
	} {
		c, err := webhook.New(webhook.Config{URL: target, Client: testClient(t)})
		require.NoError(t, err)
		require.NotContains(t, c.String(), token)
		raw, err := c.Deliver(t.Context(), delivery("k"))
		require.Error(t, err)
		require.NotContains(t, err.Error(), token, "last_error shows the URL's token")
		require.NotContains(t, string(raw), token, "the stored result shows the URL's token")
	}
}
