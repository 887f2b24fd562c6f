package webhook_test

import (
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// TestDeliver_DropAfterEffect covers a receiver that closes a reused connection after
// acting (EOF where the answer should be). One that resets it (RST, as a server does
// that closes with unread data, or with SO_LINGER 0) takes another path in net/http
// (a read error from the server, not a closed idle connection) to the same resend on a
// new connection, which the missing GetBody must stop there too.
func TestDeliver_ResetAfterEffectOnReusedConnectionIsNotResent(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	url := rawReceiver(t, func(c net.Conn) {
		if requests.Add(1) == 2 {
			// The second request (the first is the warm-up that leaves the connection
			// idle for reuse): act, then reset the connection instead of answering.
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	c, err := webhook.New(webhook.Config{URL: url, Client: testClient(t)})
	require.NoError(t, err)

	_, err = c.Deliver(t.Context(), delivery("warm-up"))
	require.NoError(t, err)

	raw, err := c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	require.Nil(t, raw)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.Equal(t, int64(2), requests.Load(), "the transport did not resend on its own")
}
