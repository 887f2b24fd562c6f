package email_test

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// A reply may be a bare code, without the space and text (RFC 5321 section 4.2: servers
// should not send one, clients must accept it). textproto refuses such a line as a short
// response, and the connector took a bare "250" to the end of the message for a lost
// reply: an ambiguous attempt, and a message the server had queued went out again on
// every retry. A bare 4xx or 5xx is the server's refusal, not an unknown outcome.
func TestDeliver_BareReplyToTheMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, reply     string
		delivered       bool
		permanent       bool
		wantServerReply string
	}{
		{"Bare250", "250\r\n", true, false, "250"},
		{"BareLastLine", "250-queued as X1\r\n250\r\n", true, false, "250 queued as X1"},
		{"Bare451", "451\r\n", false, false, ""},
		{"Bare554", "554\r\n", false, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr, messages := scriptedServer(t, tt.reply)
			c, err := email.New(email.Config{Addr: addr, From: testFrom})
			require.NoError(t, err)
			raw, err := c.Deliver(t.Context(), delivery("bare:"+tt.name, `{"to":"a@example.com","text":"x"}`))
			require.Equal(t, int64(1), messages.Load(), "the server got the whole message")
			if tt.delivered {
				require.NoError(t, err, "the server took the message (ambiguous: %t)", connectors.IsAmbiguous(err))
				require.Equal(t, tt.wantServerReply, decodeResult(t, raw).ServerReply)
				return
			}
			require.Error(t, err)
			require.False(t, connectors.IsAmbiguous(err), "the server refused the message: %v", err)
			require.Equal(t, tt.permanent, connectors.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), "end of DATA")
		})
	}
}

// scriptedServer is an SMTP server on loopback that takes every command and answers the
// end of each message with reply, verbatim. It counts the messages it read to the end.
func scriptedServer(t *testing.T, reply string) (string, *atomic.Int64) {
	t.Helper()
	var messages atomic.Int64
	addr := lineServer(t, func(conn net.Conn, r *bufio.Reader, line string) bool {
		switch cmd := strings.ToUpper(line); {
		case strings.HasPrefix(cmd, "EHLO"), strings.HasPrefix(cmd, "HELO"):
			_, _ = io.WriteString(conn, "250 mx.test\r\n")
		case strings.HasPrefix(cmd, "DATA"):
			_, _ = io.WriteString(conn, "354 go ahead\r\n")
			for line != ".\r\n" {
				var err error
				if line, err = r.ReadString('\n'); err != nil {
					return true
				}
			}
			messages.Add(1)
			_, _ = io.WriteString(conn, reply)
		case strings.HasPrefix(cmd, "QUIT"):
			_, _ = io.WriteString(conn, "221 bye\r\n")
			return true
		default: // MAIL, RCPT, RSET
			_, _ = io.WriteString(conn, "250 ok\r\n")
		}
		return false
	})
	return addr, &messages
}

// lineServer is an SMTP server on loopback: it greets each connection, and hands every
// line the client sends (its line ending left on) to handle, with the connection to
// answer on and its reader for the lines after (a message's), until handle says the
// conversation is over or the connection ends. It returns the server's address.
func lineServer(t *testing.T, handle func(conn net.Conn, r *bufio.Reader, line string) (over bool)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				_, _ = io.WriteString(conn, "220 mx.test ESMTP\r\n")
				for {
					line, err := r.ReadString('\n')
					if err != nil || handle(conn, r, line) {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
