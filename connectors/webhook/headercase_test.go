package webhook_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// A row's headers column is a JSON object, whose names may differ only in case. The
// request must not depend on Go's map order: the same row must make the same request
// (or be refused) on every attempt.
func TestDeliver_HeaderNamesDifferingInCaseAreDeterministic(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Traceparent"))
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	c, err := webhook.New(webhook.Config{URL: srv.URL, Client: testClient(t)})
	require.NoError(t, err)

	outcomes := map[string]bool{}
	for range 64 {
		mu.Lock()
		got = got[:0]
		mu.Unlock()
		_, err := c.Deliver(t.Context(), connectors.Delivery{
			Key: "k", Attempt: 1, Payload: json.RawMessage(`{}`),
			Headers: map[string]string{
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"Traceparent": "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01",
			},
		})
		mu.Lock()
		switch {
		case err != nil:
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.Empty(t, got, "a refused row is not sent")
			outcomes["refused"] = true
		default:
			require.Len(t, got, 1)
			outcomes["sent "+got[0]] = true
		}
		mu.Unlock()
	}
	require.Len(t, outcomes, 1, "the same row made different requests: %v", outcomes)
}
