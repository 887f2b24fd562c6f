package email_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// A server that refuses a recipient and closes the connection with it ("421 4.7.0 too
// many errors, closing", or a 550 and then a hang-up, as servers that limit bad
// recipients do) left the connector to send the next recipient on a dead connection.
// It then reported only that failure, "RCPT TO: EOF": the server's reply, the one
// sentence last_error could show a person, was dropped, and with it a 5xx that makes the
// row permanent, so a row whose recipient the server does not have was retried until
// its attempts ran out.
func TestDeliver_RecipientRefusalBeforeAHangUpIsKept(t *testing.T) {
	t.Parallel()
	const payload = `{"to":["first@example.com","second@example.com"],"text":"x"}`
	for _, tt := range []struct {
		name, reply string
		permanent   bool
	}{
		{"421", "421 4.7.0 mx.test too many errors, closing connection\r\n", false},
		{"550", "550 5.1.1 <first@example.com>: recipient unknown\r\n", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr := hangUpAfterFirstRcptServer(t, tt.reply)
			c, err := email.New(email.Config{Addr: addr, From: testFrom})
			require.NoError(t, err)
			_, err = c.Deliver(t.Context(), delivery("rcpt-hangup:"+tt.name, payload))
			require.Error(t, err)
			require.Contains(t, err.Error(), strings.TrimSpace(tt.reply[4:]), "the server's reply is kept")
			te, ok := errors.AsType[*textproto.Error](err)
			require.True(t, ok, "%v", err)
			require.Equal(t, tt.reply[:3], strconv.Itoa(te.Code))
			require.Equal(t, tt.permanent, connectors.IsPermanent(err), "%v", err)
			require.False(t, connectors.IsAmbiguous(err), "%v", err)
		})
	}
}

// hangUpAfterFirstRcptServer answers the first RCPT with reply and closes the connection.
func hangUpAfterFirstRcptServer(t *testing.T, reply string) string {
	t.Helper()
	return lineServer(t, func(conn net.Conn, _ *bufio.Reader, line string) bool {
		switch cmd := strings.ToUpper(line); {
		case strings.HasPrefix(cmd, "EHLO"), strings.HasPrefix(cmd, "HELO"):
			_, _ = io.WriteString(conn, "250 mx.test\r\n")
		case strings.HasPrefix(cmd, "RCPT"):
			_, _ = io.WriteString(conn, reply)
			return true
		default:
			_, _ = io.WriteString(conn, "250 ok\r\n")
		}
		return false
	})
}
