package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoadRefusesCredentialsInAPIBases: an API base with a user name and password (a
// proxy's, say) was refused for Slack alone, though the payment and Resend connectors
// never send them either (their API key goes in the Authorization header, which
// net/http then leaves as it is): serve started, and a proxy that wanted them refused
// every row, each then dead. Every API base is refused so now, never quoted.
func TestLoadRefusesCredentialsInAPIBases(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(with(db, map[string]string{
		"OUTBOX_PAYMENT_API_KEY":  "sk_test_123",
		"OUTBOX_PAYMENT_API_BASE": "https://proxyuser:S3CRET@stripe.example/",
		"OUTBOX_EMAIL_API_KEY":    "re_123",
		"OUTBOX_EMAIL_FROM":       "outbox@example.com",
		"OUTBOX_EMAIL_API_BASE":   "https://proxyuser@resend.example",
		"OUTBOX_SLACK_TOKEN":      "xoxb-123",
		"OUTBOX_SLACK_API_BASE":   "https://proxyuser:S3CRET@slack.com/api/",
	})))
	require.Equal(t, []string{
		`OUTBOX_PAYMENT_API_BASE must not carry a user name or password: the API key or token authenticates, and they would not be sent`,
		`OUTBOX_EMAIL_API_BASE must not carry a user name or password: the API key or token authenticates, and they would not be sent`,
		`OUTBOX_SLACK_API_BASE must not carry a user name or password: the API key or token authenticates, and they would not be sent`,
	}, problemLines(t, err))
}
