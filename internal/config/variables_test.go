package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVariables(t *testing.T) {
	t.Parallel()

	vars := Variables()
	seen := make(map[string]bool)
	for _, v := range vars {
		require.True(t, strings.HasPrefix(v.Name, "OUTBOX_"), v.Name)
		require.NotEmpty(t, v.Description, "%s has no desc tag", v.Name)
		require.False(t, seen[v.Name], "%s listed twice", v.Name)
		seen[v.Name] = true
	}
	for _, name := range []string{
		"OUTBOX_DATABASE_URL", "OUTBOX_HTTP_ADDR", "OUTBOX_LOG_FORMAT", "OUTBOX_LOG_LEVEL",
		"OUTBOX_BATCH_SIZE", "OUTBOX_CONCURRENCY", "OUTBOX_MAX_CLAIMED_BYTES", "OUTBOX_LEASE", "OUTBOX_POLL_INTERVAL",
		"OUTBOX_MAX_ATTEMPTS", "OUTBOX_MAX_AGE", "OUTBOX_BACKOFF_BASE", "OUTBOX_BACKOFF_MAX",
		"OUTBOX_RETENTION", "OUTBOX_SHUTDOWN_TIMEOUT", "OUTBOX_RELAY_ID", "OUTBOX_CONNECTORS",
		"OUTBOX_API_TOKENS", "OUTBOX_APPROVAL_REQUIRED", "OUTBOX_API_RATE", "OUTBOX_API_MAX_BODY", "OUTBOX_MCP_TOKEN",
		"OUTBOX_WEBHOOK_URL", "OUTBOX_WEBHOOK_SECRET", "OUTBOX_WEBHOOK_TIMEOUT", "OUTBOX_WEBHOOK_RATE",
		"OUTBOX_WEBHOOK_CONCURRENCY", "OUTBOX_WEBHOOK_GUARANTEE", "OUTBOX_WEBHOOK_ON_AMBIGUOUS",
		"OUTBOX_PAYMENT_API_KEY", "OUTBOX_PAYMENT_API_BASE", "OUTBOX_PAYMENT_TIMEOUT", "OUTBOX_PAYMENT_RATE",
		"OUTBOX_PAYMENT_CONCURRENCY",
		"OUTBOX_SMTP_ADDR", "OUTBOX_SMTP_USERNAME", "OUTBOX_SMTP_PASSWORD", "OUTBOX_SMTP_TLS", "OUTBOX_SMTP_TIMEOUT",
		"OUTBOX_EMAIL_TRANSPORT", "OUTBOX_EMAIL_FROM", "OUTBOX_EMAIL_RATE", "OUTBOX_EMAIL_CONCURRENCY", "OUTBOX_EMAIL_ON_AMBIGUOUS",
		"OUTBOX_EMAIL_API_KEY", "OUTBOX_EMAIL_API_BASE", "OUTBOX_EMAIL_API_TIMEOUT",
		"OUTBOX_SLACK_TOKEN", "OUTBOX_SLACK_API_BASE", "OUTBOX_SLACK_TIMEOUT", "OUTBOX_SLACK_HISTORY_LIMIT",
		"OUTBOX_SLACK_RATE", "OUTBOX_SLACK_CONCURRENCY",
	} {
		require.True(t, seen[name], "%s is not listed", name)
	}
	require.Len(t, vars, 53)
	// No payment guarantee or ambiguity policy: payment is always enforced.
	require.False(t, seen["OUTBOX_PAYMENT_GUARANTEE"])
	require.False(t, seen["OUTBOX_PAYMENT_ON_AMBIGUOUS"])

	byName := make(map[string]Variable)
	for _, v := range vars {
		byName[v.Name] = v
	}
	require.Equal(t, Variable{
		Name:        "OUTBOX_WEBHOOK_TIMEOUT",
		Default:     "10s",
		Description: byName["OUTBOX_WEBHOOK_TIMEOUT"].Description,
		Kind:        "webhook",
	}, byName["OUTBOX_WEBHOOK_TIMEOUT"])
	require.Equal(t, "168h", byName["OUTBOX_RETENTION"].Default)
	require.Empty(t, byName["OUTBOX_RETENTION"].Kind)
	require.Empty(t, byName["OUTBOX_DATABASE_URL"].Default)
	require.Equal(t, "email", byName["OUTBOX_SMTP_ADDR"].Kind)
	require.Equal(t, "email", byName["OUTBOX_EMAIL_FROM"].Kind)
	require.Equal(t, "https://api.stripe.com", byName["OUTBOX_PAYMENT_API_BASE"].Default)
	require.Equal(t, "https://slack.com/api/", byName["OUTBOX_SLACK_API_BASE"].Default)
	require.Equal(t, "100", byName["OUTBOX_SLACK_HISTORY_LIMIT"].Default)
	require.Equal(t, "opportunistic", byName["OUTBOX_SMTP_TLS"].Default)
}

func TestVariablesFieldNamesUnique(t *testing.T) {
	t.Parallel()

	// env.ParseError names the Go field, not the variable; parseEnv maps one to the
	// other, which works while no struct it parses has two fields of the same name.
	for _, typ := range []reflect.Type{reflect.TypeFor[Config](), reflect.TypeFor[Webhook](), reflect.TypeFor[Payment](),
		reflect.TypeFor[SMTP](), reflect.TypeFor[EmailSettings](), reflect.TypeFor[Slack](),
	} {
		fields := make(map[string]string)
		for _, v := range variablesOf(typ, "") {
			require.NotContains(t, fields, v.field, "%s: field %s reads both %s and %s", typ, v.field, fields[v.field], v.Name)
			fields[v.field] = v.Name
		}
	}
}
