package email

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/wneessen/go-mail/smtp"
)

// endData's write of the message's end fails when the server broke the connection
// after its 354 (it crashed, a content filter gave up) without reading the message: the
// final "." never left, so the server cannot have accepted the message, and endData says
// so (sent false, the write's error) instead of reading no reply and leaving send to
// call the attempt one the server may have accepted. Over net.Pipe, which buffers
// nothing, the write cannot complete before the server's close, whatever the
// scheduling.
func TestEndDataWhoseWriteFailedWasNotSent(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	t.Cleanup(func() { _ = client.Close() })
	go func() {
		defer server.Close() //nolint:errcheck // the break the test is about
		r := bufio.NewReader(server)
		_, _ = io.WriteString(server, "220 mx.test ESMTP\r\n")
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			switch cmd := strings.ToUpper(line); {
			case strings.HasPrefix(cmd, "EHLO"):
				_, _ = io.WriteString(server, "250 mx.test\r\n")
			case strings.HasPrefix(cmd, "DATA"):
				_, _ = io.WriteString(server, "354 go ahead\r\n")
				return // and reads nothing more
			default:
				_, _ = io.WriteString(server, "250 ok\r\n")
			}
		}
	}()
	c, err := smtp.NewClient(client, "mx.test")
	require.NoError(t, err)
	require.NoError(t, c.Hello("relay.test"))
	require.NoError(t, c.Mail("from@example.com"))
	require.NoError(t, c.Rcpt("to@example.com"))
	w, err := c.Data()
	require.NoError(t, err)
	_, err = io.WriteString(w, "Subject: s\r\n\r\nx\r\n") // buffered: nothing of it left yet
	require.NoError(t, err)

	_, _, sent, err := endData(c, w.(*smtp.DataCloser))
	require.Error(t, err)
	require.False(t, sent, "the message's end was not written: %v", err)
}
