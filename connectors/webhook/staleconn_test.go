package webhook_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// A connection that the receiver (or a load balancer in front of it) resets just as a
// row's request is put on it: a keep-alive one it times out, or a new one it refuses
// work on. net/http has the request in the connection's write buffer and reports it
// written (httptrace's WroteRequest) before it flushes that buffer; the flush then
// fails, and not a byte reaches the receiver. The attempt was a plain retryable failure,
// but was reported ambiguous ("no readable answer after the request was sent; the
// receiver may have acted"): a forwarded instance with the hold policy held the row for
// an operator, and every instance's last_error and attempts log said the receiver may
// have acted when it had been sent nothing.
func TestDeliver_ConnectionResetBeforeTheRequestLeftIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	for _, reused := range []bool{true, false} {
		name := map[bool]string{true: "IdleKeepAlive", false: "NewConnection"}[reused]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resetNow, reset := make(chan struct{}), make(chan struct{})
			var requests atomic.Int64
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			connectortest.ServeConns(t, ln, func(c net.Conn) {
				if reused {
					req, err := http.ReadRequest(bufio.NewReader(c))
					if err != nil {
						return
					}
					requests.Add(1)
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
				<-resetNow // until the next request is being written on the connection
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close() // RST
				close(reset)
			})
			url := "http://" + ln.Addr().String() + "/hook"
			c, err := webhook.New(webhook.Config{URL: url}) // the shared transport, as in production
			require.NoError(t, err)
			if reused {
				_, err = c.Deliver(t.Context(), delivery("warm-up"))
				require.NoError(t, err)
			}

			// The hook runs in net/http's write loop once the request's headers are in the
			// connection's buffer, before anything of the request is flushed to it.
			ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
				WroteHeaders: func() {
					close(resetNow)
					<-reset
				},
			})
			raw, err := c.Deliver(ctx, delivery("k"))
			require.Error(t, err)
			require.Nil(t, raw)
			require.Equal(t, requests.Load(), map[bool]int64{true: 1, false: 0}[reused], "only a warm-up reached the receiver")
			require.False(t, connectors.IsAmbiguous(err), "nothing of the request was sent: %v", err)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.ErrorContains(t, err, "POST "+connectors.RedactEndpoint(url)+": the request could not be sent: ")
		})
	}
}
