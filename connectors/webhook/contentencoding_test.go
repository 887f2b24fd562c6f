package webhook_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/webhook"
)

// An answer's Content-Encoding is not taken on trust. The transport asked for gzip and
// decompressed what said it was gzip; an answer that said so and was not (a lying
// header, a proxy that decompressed and kept it) failed at its first byte, and the
// result and last_error held nothing of it: a 400 read "receiver answered 400 Bad
// Request" with no reason, the result {"body": "", "truncated": true}. The connector now
// asks for no compression, reads a gzip answer (a receiver compressing anyway) itself,
// and an answer that only says it is gzip as sent.
func TestDeliver_AnswerContentEncoding(t *testing.T) {
	t.Parallel()
	const reason = `{"error":"field \"order\" is required"}`
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write([]byte(reason))
	require.NoError(t, zw.Close())

	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.Header.Get("Accept-Encoding"))
		switch r.Header.Get("Idempotency-Key") {
		case "lie":
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(reason))
		case "unasked":
			// Compressing middleware set to compress whatever the request accepts.
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(zipped.Bytes())
		case "x-gzip":
			w.Header().Set("Content-Encoding", "x-gzip")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(zipped.Bytes())
		}
	}))
	t.Cleanup(srv.Close)
	c, err := webhook.New(webhook.Config{URL: srv.URL, Client: testClient(t)})
	require.NoError(t, err)

	for _, key := range []string{"lie", "unasked", "x-gzip"} {
		raw, err := c.Deliver(t.Context(), delivery(key))
		require.Error(t, err, key)
		require.Contains(t, err.Error(), `receiver answered 400 Bad Request: {"error":"field \"order\" is required"}`, key)
		res := decodeResult(t, raw)
		require.Equal(t, reason, res.Body, key)
		require.False(t, res.Truncated, key)
	}
	require.Equal(t, []string{"", "", ""}, asked, "no compressed answer is asked for")
}
