package email_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/email"
)

// Config's String and LogValue keep the password out, but showed Addr as written, so
// an address written as a URL with credentials (smtp://user:pass@host:587, which New
// refuses) printed the password wherever the Config was logged, as an application does
// next to New's error. What comes before an "@" in it is never shown.
func TestConfigDoesNotShowAPasswordInAddr(t *testing.T) {
	t.Parallel()
	const pass = "hunter2-very-secret"
	for _, addr := range []string{"smtp://relay:" + pass + "@smtp.example.com:587", "relay:" + pass + "@smtp.example.com:587"} {
		cfg := email.Config{Addr: addr, From: testFrom}
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("configured", "config", cfg)
		for _, s := range []string{buf.String(), fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%v", &cfg)} {
			require.NotContains(t, s, "hunter2", addr)
			require.Contains(t, s, "smtp.example.com:587", addr)
		}
	}
}
