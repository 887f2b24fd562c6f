package webhook_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// rawReceiver is a receiver on loopback that reads each request whole and answers it
// with answer, written as is: it can send what no well-behaved server would. It returns
// the URL to POST to. Its connections are closed at cleanup, idle ones in a client's
// pool included.
func rawReceiver(t *testing.T, answer func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	connectortest.ServeConns(t, ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			answer(c)
		}
	})
	return "http://" + ln.Addr().String() + "/hook"
}

// An answer's headers are bounded well below net/http's 10 MiB. An attempt held about
// three times its answer's headers while reading them (16 attempts at once against a
// receiver answering with 10 MiB of them held 443 MB), so at the relay's default of 128
// deliveries in flight one such receiver could have the relay killed for memory, and
// every instance's deliveries with it. The answer is not read; the attempt is ambiguous,
// as the receiver may have acted.
func TestDeliver_AnswerHeadersAreBounded(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("a", 1<<20)
	url := rawReceiver(t, func(c net.Conn) {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: "+big+"\r\nContent-Length: 2\r\n\r\nok")
	})
	c, err := webhook.New(webhook.Config{URL: url}) // the shared transport, as in production
	require.NoError(t, err)

	raw, err := c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err, "an answer with 1 MiB of headers is not read")
	require.Nil(t, raw)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.False(t, connectors.IsPermanent(err))
	require.ErrorContains(t, err, "no readable answer after the request was sent; the receiver may have acted")
	require.ErrorContains(t, err, "65536 bytes")

	// Headers of a usual size are read as ever.
	url = rawReceiver(t, func(c net.Conn) {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: "+big[:8<<10]+"\r\nContent-Length: 2\r\n\r\nok")
	})
	c, err = webhook.New(webhook.Config{URL: url})
	require.NoError(t, err)
	raw, err = c.Deliver(t.Context(), delivery("k"))
	require.NoError(t, err)
	require.JSONEq(t, `{"status":200,"body":"ok"}`, string(raw))
}

// The bound covers the informational answers before the final one too: net/http reads
// past any number of them (103 Early Hints, say), counting their headers against the
// same bound, so a receiver that sends them without end had each attempt read 10 MiB of
// them (or run to its time limit, on a slow link) before it failed. Now it fails once
// they pass 64 KiB.
func TestDeliver_EndlessInformationalAnswersAreBounded(t *testing.T) {
	t.Parallel()
	url := rawReceiver(t, func(c net.Conn) {
		for {
			if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"); err != nil {
				return // the connector gave up
			}
		}
	})
	c, err := webhook.New(webhook.Config{URL: url, Timeout: time.Minute})
	require.NoError(t, err)

	raw, err := c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	require.Nil(t, raw)
	require.NotErrorIs(t, err, webhook.ErrTimeout, "the attempt ended at the bound, not at its time limit")
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.ErrorContains(t, err, "65536 bytes")
}

// An answer that came but could not be read (malformed) was reported as "connection
// closed after the request was sent", which sends a person to look at the network, not
// at the receiver's answer. It now says no readable answer came.
func TestDeliver_MalformedAnswerIsNotCalledAClosedConnection(t *testing.T) {
	t.Parallel()
	url := rawReceiver(t, func(c net.Conn) {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Le\r\n\r\n")
	})
	c, err := webhook.New(webhook.Config{URL: url})
	require.NoError(t, err)

	_, err = c.Deliver(t.Context(), delivery("k"))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.ErrorContains(t, err, "no readable answer after the request was sent; the receiver may have acted: ")
	require.ErrorContains(t, err, `malformed MIME header`)
	require.NotContains(t, err.Error(), "connection closed")
}
