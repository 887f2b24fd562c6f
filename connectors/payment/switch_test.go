package payment_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
)

// An answer of 101 Switching Protocols hands its connection over as its body, which the
// attempt's timeout no longer bounds (net/http gives it to the caller). stripe-go reads
// every answer's body, so Deliver waited for the server to hang up, past its timeout
// and its row's lease; the webhook connector had been fixed for this, payment had not.
// It is now a permanent answer, classified by its status.
func TestDeliver_SwitchingProtocols(t *testing.T) {
	t.Parallel()
	hangUp := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n")
		_ = rw.Flush()
		<-hangUp // the connection stays open, as a server that switched would keep it
	}))
	t.Cleanup(srv.Close)
	// Generous for a busy machine, and still well short of the watchdog below, which a
	// Deliver that reads the handed-over connection reaches whatever the timeout.
	c, err := payment.New(payment.Config{APIKey: testKey, APIBase: srv.URL, Timeout: 10 * time.Second, HTTPClient: &http.Client{}})
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := c.Deliver(t.Context(), delivery("k", createPI))
		done <- err
	}()
	var err2 error
	select {
	case err2 = <-done:
		close(hangUp)
	case <-time.After(time.Minute): // a watchdog, not a timing check: without the fix it never returns
		close(hangUp)
		t.Fatal("Deliver still reads the connection a 101 answer handed over")
	}
	require.True(t, connectors.IsPermanent(err2), "%v", err2)
	require.False(t, connectors.IsAmbiguous(err2), "%v", err2)
	require.Contains(t, err2.Error(), "101 Switching Protocols")
}
