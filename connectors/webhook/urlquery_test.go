package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/webhook"
)

// url.Parse keeps a URL's query as written, and net/http writes it so into the request
// line, where HTTP/1.1 allows no space (RFC 9112 section 3.2) and Node's parser takes no
// byte past ASCII: every row would be refused (400) and go dead. The query goes as a
// browser sends it, those percent-encoded, and the receiver reads the same values.
func TestDeliver_URLQueryIsSentEncoded(t *testing.T) {
	t.Parallel()
	query := make(chan *url.URL, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query <- r.URL
	}))
	t.Cleanup(srv.Close)
	c, err := webhook.New(webhook.Config{URL: srv.URL + "/hook?source=outbox relay&site=café&t=a%2Bb", Client: testClient(t)})
	require.NoError(t, err)

	_, err = c.Deliver(t.Context(), delivery("k"))
	require.NoError(t, err)
	got := <-query
	require.Equal(t, "source=outbox%20relay&site=caf%C3%A9&t=a%2Bb", got.RawQuery, "the request line's query")
	require.Equal(t, url.Values{"source": {"outbox relay"}, "site": {"café"}, "t": {"a+b"}}, got.Query())
}
