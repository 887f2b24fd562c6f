package connectortest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboxd/outboxd/connectors"
)

// DeliverAfterProtocolSwitch starts a receiver that answers every request with 101
// Switching Protocols and then keeps the connection open, as a server that switched
// would, builds a connector for its URL with newConnector, and returns what the
// connector's Deliver of d returns. net/http hands such an answer's connection over as
// its body, which the attempt's timeout no longer bounds: a Deliver that reads it never
// returns, and a watchdog fails t after a minute (not a timing check). Give the
// connector a timeout generous for a busy machine: the 101 must reach Deliver within it.
func DeliverAfterProtocolSwitch(t *testing.T, newConnector func(url string) connectors.Connector, d connectors.Delivery) (json.RawMessage, error) {
	t.Helper()
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
	c := newConnector(srv.URL)

	type answer struct {
		raw json.RawMessage
		err error
	}
	done := make(chan answer, 1)
	go func() {
		raw, err := c.Deliver(t.Context(), d)
		done <- answer{raw, err}
	}()
	select {
	case got := <-done:
		close(hangUp)
		return got.raw, got.err
	case <-time.After(time.Minute): // a watchdog, not a timing check: without the fix it never returns
		close(hangUp)
		t.Fatal("Deliver still reads the connection a 101 answer handed over")
		return nil, nil
	}
}
