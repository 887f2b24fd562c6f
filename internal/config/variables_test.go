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
		"OUTBOX_BATCH_SIZE", "OUTBOX_CONCURRENCY", "OUTBOX_LEASE", "OUTBOX_POLL_INTERVAL",
		"OUTBOX_MAX_ATTEMPTS", "OUTBOX_MAX_AGE", "OUTBOX_BACKOFF_BASE", "OUTBOX_BACKOFF_MAX",
		"OUTBOX_RETENTION", "OUTBOX_SHUTDOWN_TIMEOUT", "OUTBOX_RELAY_ID", "OUTBOX_CONNECTORS",
		"OUTBOX_WEBHOOK_URL", "OUTBOX_WEBHOOK_SECRET", "OUTBOX_WEBHOOK_TIMEOUT", "OUTBOX_WEBHOOK_RATE",
		"OUTBOX_WEBHOOK_CONCURRENCY", "OUTBOX_WEBHOOK_GUARANTEE", "OUTBOX_WEBHOOK_ON_AMBIGUOUS",
	} {
		require.True(t, seen[name], "%s is not listed", name)
	}
	require.Len(t, vars, 23)

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
}

func TestVariablesFieldNamesUnique(t *testing.T) {
	t.Parallel()

	// env.ParseError names the Go field, not the variable; parseEnv maps one to the
	// other, which works while no struct it parses has two fields of the same name.
	for _, typ := range []reflect.Type{reflect.TypeFor[Config](), reflect.TypeFor[Webhook]()} {
		fields := make(map[string]string)
		for _, v := range variablesOf(typ, "") {
			require.NotContains(t, fields, v.field, "%s: field %s reads both %s and %s", typ, v.field, fields[v.field], v.Name)
			fields[v.field] = v.Name
		}
	}
}
