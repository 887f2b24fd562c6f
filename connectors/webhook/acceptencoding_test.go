package webhook_test

import (
	"compress/gzip"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// A row's own accept-encoding header (one copied from an incoming request, say) asked
// for a compressed answer, which the transport then left compressed, so the stored
// result held the compressed bytes instead of the receiver's answer. It is dropped.
func TestDeliver_RowAcceptEncodingKeepsTheResultReadable(t *testing.T) {
	t.Parallel()
	const answer = `{"received": true}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			_, _ = w.Write([]byte(answer))
			return
		}
		// As compressing middleware does: gzip whenever the request accepts it.
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = zw.Write([]byte(answer))
		_ = zw.Close()
	}))
	t.Cleanup(srv.Close)
	c, err := webhook.New(webhook.Config{URL: srv.URL, Client: testClient(t)})
	require.NoError(t, err)

	res, err := c.Deliver(t.Context(), connectors.Delivery{
		Key: "k", Attempt: 1, Payload: json.RawMessage(`{}`),
		Headers: map[string]string{"accept-encoding": "gzip"},
	})
	require.NoError(t, err)
	var got struct {
		Body string `json:"body"`
	}
	require.NoError(t, json.Unmarshal(res, &got))
	require.Equal(t, answer, got.Body, "the stored result is the receiver's answer, decompressed")
}
