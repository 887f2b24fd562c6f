package main

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// outboxd mcp whose OUTBOX_DATABASE_URL names a database that does not exist, or a role
// the server refuses, started anyway: every tool call then answered "the database is
// unavailable; calling again later with the same key is safe", which no later call
// makes true, while the reason went only to stderr, which an MCP client seldom shows.
// The agent retries for ever, and `outboxd mcp < calls.jsonl` exits 0 having written
// nothing. PostgreSQL answered, and refused the session for good: refused at start, as
// a database without the outbox schema is.
func TestMCPCommandRefusesADatabaseThatRefusesItsSessions(t *testing.T) {
	t.Parallel()
	const secret = "obx_cmd-refused-secret"
	base, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	for name, change := range map[string]func(u *url.URL){
		"NoSuchDatabase": func(u *url.URL) { u.Path = "/outboxd_no_such_database" },
		"NoSuchRole":     func(u *url.URL) { u.User = url.User("outboxd_no_such_role") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			u := *base
			change(&u)
			environ := []string{"OUTBOX_DATABASE_URL=" + u.String(), mcpTokensEnv(secret), "OUTBOX_MCP_TOKEN=" + secret}
			code, out, errOut := runCLI(t, environ, strings.NewReader(""), "mcp")
			require.Equal(t, exitFailure, code, "%s%s", out, errOut)
			require.Contains(t, errOut, "does not exist")
			require.NotContains(t, errOut, "serving on stdio")
			require.Empty(t, out)
		})
	}
}
