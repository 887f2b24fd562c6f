package email_test

import (
	"bufio"
	"encoding/base64"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// Config.Password "never appears in logs or errors", yet a server's refusal of the login
// went into the error, and into the row's last_error, as the server wrote it. AUTH PLAIN
// sends the user name and password in base64, which anyone decodes, and AUTH LOGIN the
// password alone in base64; a server that quotes what it refused (as Sendmail quotes a
// line it does not recognise, or a test server that says what it got) put them there.
func TestDeliver_RefusedLoginQuotingTheCredentialsDoesNotShowThem(t *testing.T) {
	t.Parallel()
	const user, pass = "relay", "s3cret-pa55word"
	for _, mech := range []string{"PLAIN", "LOGIN"} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			addr := quotingAuthServer(t, mech)
			c, err := email.New(email.Config{Addr: addr, From: testFrom, Username: user, Password: pass})
			require.NoError(t, err)
			_, err = c.Deliver(t.Context(), delivery("auth-quoted:1", `{"to":"a@example.com","text":"x"}`))
			require.Error(t, err)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), "535")
			for _, secret := range []string{
				pass,
				base64.StdEncoding.EncodeToString([]byte(pass)),
				base64.StdEncoding.EncodeToString([]byte("\x00" + user + "\x00" + pass)),
			} {
				require.NotContains(t, err.Error(), secret, "the error shows the password or its base64")
			}
		})
	}
}

// quotingAuthServer offers AUTH mech and refuses every login with a 535 that quotes the
// client's last line and what it decodes to.
func quotingAuthServer(t *testing.T, mech string) string {
	t.Helper()
	logins := 0 // of the connection under way (one at a time), counted from its EHLO
	return lineServer(t, func(conn net.Conn, _ *bufio.Reader, line string) bool {
		line = strings.TrimRight(line, "\r\n")
		switch cmd := strings.ToUpper(line); {
		case strings.HasPrefix(cmd, "EHLO"):
			logins = 0
			_, _ = io.WriteString(conn, "250-mx.test\r\n250 AUTH "+mech+"\r\n")
		case cmd == "AUTH LOGIN":
			_, _ = io.WriteString(conn, "334 VXNlcm5hbWU6\r\n")
		case strings.HasPrefix(cmd, "AUTH PLAIN "):
			quote(conn, strings.TrimPrefix(line, "AUTH PLAIN "))
		case cmd == "QUIT":
			_, _ = io.WriteString(conn, "221 bye\r\n")
			return true
		case mech == "LOGIN" && logins == 0:
			logins++
			_, _ = io.WriteString(conn, "334 UGFzc3dvcmQ6\r\n")
		case mech == "LOGIN" && logins == 1:
			logins++
			quote(conn, line)
		default:
			_, _ = io.WriteString(conn, "501 5.5.2 syntax error\r\n")
		}
		return false
	})
}

func quote(w io.Writer, got string) {
	decoded, _ := base64.StdEncoding.DecodeString(got)
	shown := strings.ReplaceAll(string(decoded), "\x00", " ")
	_, _ = io.WriteString(w, "535 5.7.8 authentication failed for "+got+" ("+shown+")\r\n")
}
