package payment_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
)

// ErrTimeout's documentation: "the cause of an attempt that ran past [Config.Timeout];
// errors.Is finds it in the error Deliver returns". An attempt whose answer began in time
// (status and headers) but whose body did not end within the limit was reported as
// "Stripe answered 200 OK but the answer could not be read; it may have acted: payment
// attempt timed out", with ErrTimeout only in the text: errors.Is did not find it.
func TestDeliver_TimeoutIsErrTimeout(t *testing.T) {
	t.Parallel()
	stall := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.Header.Get("Idempotency-Key") == "answer-cut" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, `{"id":"pi_1",`)
			w.(http.Flusher).Flush()
		}
		select {
		case <-stall:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stall) }) // runs before srv.Close
	c, err := payment.New(payment.Config{APIKey: testKey, APIBase: srv.URL, Timeout: time.Second, HTTPClient: &http.Client{}})
	require.NoError(t, err)

	for _, key := range []string{"no-answer", "answer-cut"} {
		_, err := c.Deliver(t.Context(), delivery(key, createPI))
		require.ErrorIs(t, err, payment.ErrTimeout, key)
		require.True(t, connectors.IsAmbiguous(err), "%s: %v", key, err)
		require.False(t, connectors.IsPermanent(err), "%s: %v", key, err)
	}
}
