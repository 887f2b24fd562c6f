package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/email"
)

// An Addr written as a URL with credentials, as other tools take it, was quoted whole
// when it was not host:port or had no valid port, password included, in the error New
// returns and its caller logs; only a host with an "@" in it was shown without what
// comes before, and outboxd's configuration never quotes that part. None of the
// messages quotes it now.
func TestNew_AddrErrorsDoNotQuoteAPassword(t *testing.T) {
	t.Parallel()
	const pass = "hunter2-very-secret"
	for _, addr := range []string{
		"smtp://relay:" + pass + "@smtp.example.com:587", // not host:port (too many colons)
		"relay:" + pass + "@smtp.example.com",            // the "port" is the password's end
		"relay:" + pass + "@smtp.example.com:99999",      // not host:port
		pass + "@smtp.example.com:587",                   // a host with an "@"
		"relay:" + pass + "@:587",                        // not host:port
	} {
		_, err := email.New(email.Config{Addr: addr, From: testFrom})
		require.Error(t, err, addr)
		require.Contains(t, err.Error(), "Addr:", addr)
		require.NotContains(t, err.Error(), pass, addr)
		require.NotContains(t, err.Error(), "hunter2", addr)
	}
}
