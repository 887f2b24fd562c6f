package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoadRefusesAnSMTPHostNoDialCanLookUp: OUTBOX_SMTP_ADDR's host was only checked to
// be there, so " smtp.example.com:587" (a space from an env file) or a host with a "/"
// passed, serve started, and every email attempt failed with "no such host" until its
// row was dead; URL settings with such a host were refused at start.
func TestLoadRefusesAnSMTPHostNoDialCanLookUp(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct{ addr, host string }{
		{" smtp.example.com:587", " smtp.example.com"},
		{"smtp example.com:587", "smtp example.com"},
		{"smtp.example.com/:587", "smtp.example.com/"},
		{"smtp..example.com:587", "smtp..example.com"},
	} {
		_, err := Load(environ(with(db, map[string]string{
			"OUTBOX_SMTP_ADDR":  tt.addr,
			"OUTBOX_EMAIL_FROM": "outbox@example.com",
		})))
		require.Equal(t, []string{
			`OUTBOX_SMTP_ADDR must be host:port, such as smtp.example.com:587, and "` + tt.host + `" is not a host name or IP address`,
		}, problemLines(t, err), tt.addr)
	}

	for _, addr := range []string{"smtp.example.com:587", "SMTP.Example.COM.:25", "mail_relay:2525", "127.0.0.1:25", "[::1]:25", "[fe80::1%eth0]:25"} {
		_, err := Load(environ(with(db, map[string]string{
			"OUTBOX_SMTP_ADDR":  addr,
			"OUTBOX_EMAIL_FROM": "outbox@example.com",
		})))
		require.NoError(t, err, addr)
	}
}
