package main

import (
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// roleEnv creates a login role with grants on d's database and returns the environment
// that points the commands at d as that role; skipped where the test database's role
// may not create roles.
func roleEnv(t *testing.T, d *opsDB, prefix string, grants ...string) []string {
	t.Helper()
	role := pgtest.Role(t, d.pool, prefix, grants...)
	u, err := url.Parse(d.dsn)
	require.NoError(t, err)
	u.User = url.User(role)
	return []string{"OUTBOX_DATABASE_URL=" + u.String(), "USER=alice"}
}

// The operator commands run as roles with exactly the README's grants: the reading
// ones with SELECT on outbox, outbox_attempts and outbox_audit, the changing ones with
// the README's operator grants. A role without them gets one line naming the table.
func TestOperatorCommandsWorkWithTheREADMEsPrivileges(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	d.insert(t, fixture{Key: "k-awaiting-2", Status: outbox.StatusAwaitingApproval})
	// Replayed under its own key: k-dead, copied by replay --new-key first, is refused then
	// (its copy is on its way).
	d.insert(t, fixture{Key: "k-dead-2", Status: outbox.StatusDead})
	old := d.insert(t, fixture{Key: "k-old", Status: outbox.StatusDelivered, Age: 48 * time.Hour})
	_, err := d.pool.Exec(t.Context(), `INSERT INTO outbox_audit (outbox_id, action, actor, reason) VALUES ($1, 'replay', 'bob', 'x')`, old)
	require.NoError(t, err)

	reader := roleEnv(t, d, "outboxd_reader_", `GRANT SELECT ON outbox, outbox_attempts, outbox_audit TO ROLE_`)
	for _, args := range [][]string{{"status"}, {"list"}, {"inspect", "k-old"}, {"list", "--json"}} {
		code, _, errOut := runCLI(t, reader, strings.NewReader(""), args...)
		require.Equal(t, exitOK, code, "%v: %s", args, errOut)
	}
	code, _, errOut := runCLI(t, reader, strings.NewReader(""), "cancel", "k-pending", "--reason", "x")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "permission denied for table outbox")

	operator := roleEnv(t, d, "outboxd_operator_",
		`GRANT SELECT, INSERT, UPDATE, DELETE ON outbox TO ROLE_`,
		`GRANT SELECT, INSERT, DELETE ON outbox_attempts TO ROLE_`,
		`GRANT SELECT, INSERT ON outbox_audit TO ROLE_`)
	for _, args := range [][]string{
		{"status"}, {"list"}, {"inspect", "k-held"},
		{"replay", "--key", "k-dead", "--new-key", "--reason", "again"},
		{"replay", "--key", "k-dead-2", "--reason", "receiver fixed"},
		{"replay", "--key", "k-stuck", "--reason", "stuck"},
		{"replay", "--key", "k-delivered", "--redeliver", "--reason", "again"},
		{"cancel", "k-pending", "--reason", "refunded"},
		{"approve", "k-awaiting", "--reason", "ok"},
		{"reject", "k-awaiting-2", "--reason", "no"},
		{"purge", "--older-than", "24h", "--payload-only", "--reason", "erasure"},
		{"purge", "--older-than", "24h"},
		{"enqueue", "--key", "by-operator", "--connector", "webhook", "--payload", "{}"},
	} {
		code, out, errOut := runCLI(t, operator, strings.NewReader(""), args...)
		require.Equal(t, exitOK, code, "%v: %s%s", args, out, errOut)
	}
	require.Equal(t, 0, d.count(t, `SELECT count(*) FROM outbox WHERE idempotency_key = 'k-old'`))
	require.Equal(t, 0, d.count(t, `SELECT count(*) FROM outbox_audit WHERE outbox_id = $1`, old))
	require.Equal(t, outbox.StatusPending, d.status(t, "k-awaiting"))
	require.Equal(t, outbox.StatusCanceled, d.status(t, "k-awaiting-2"))
}

// outboxd serve with the intent API (and /mcp) approves, rejects and cancels with the
// same library calls as the commands: its role needs the relay's grants and SELECT,
// INSERT on outbox_audit, as the README says. With the relay's grants alone each of them
// failed with "permission denied for table outbox_audit".
func TestAPIDecisionsWorkWithTheREADMEsServeGrants(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	d.insert(t, fixture{Key: "k-awaiting-2", Status: outbox.StatusAwaitingApproval})
	serve := roleEnv(t, d, "outboxd_serve_",
		`GRANT SELECT, INSERT, UPDATE, DELETE ON outbox, outbox_attempts, outbox_wake_connectors TO ROLE_`,
		`GRANT SELECT ON outbox_schema_migrations TO ROLE_`,
		`GRANT SELECT, INSERT ON outbox_audit TO ROLE_`)
	for _, args := range [][]string{
		{"approve", "k-awaiting", "--reason", "ok"},
		{"reject", "k-awaiting-2", "--reason", "no"},
		{"cancel", "k-pending", "--reason", "refunded"},
		{"list"},
		{"enqueue", "--key", "by-api", "--connector", "webhook", "--payload", "{}"},
	} {
		code, out, errOut := runCLI(t, serve, strings.NewReader(""), args...)
		require.Equal(t, exitOK, code, "%v: %s%s", args, out, errOut)
	}
}

// outboxd mcp proposes, reads back and lists as a role with only SELECT, INSERT on
// outbox, as the README says.
func TestMCPWorksWithTheREADMEsPrivileges(t *testing.T) {
	t.Parallel()
	const secret = "obx_role-test-secret"
	d := newOpsDB(t)
	env := append(roleEnv(t, d, "outboxd_mcp_", `GRANT SELECT, INSERT ON outbox TO ROLE_`),
		mcpTokensEnv(secret), "OUTBOX_MCP_TOKEN="+secret)

	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	var stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(t.Context(), []string{"mcp"}, env, stdinR, stdoutW, &stderr)
		_ = stdoutW.Close()
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).
		Connect(t.Context(), &mcp.IOTransport{Reader: stdoutR, Writer: stdinW}, nil)
	require.NoError(t, err, stderr.String())
	for _, call := range []*mcp.CallToolParams{
		{Name: "propose_intent", Arguments: map[string]any{"connector": "webhook", "key": "by-agent", "payload": map[string]any{"n": 1}, "reason": "r"}},
		{Name: "propose_intent", Arguments: map[string]any{"connector": "webhook", "key": "by-agent", "payload": map[string]any{"n": 1}, "reason": "r"}},
		{Name: "get_intent", Arguments: map[string]any{"key": "by-agent"}},
		{Name: "list_intents", Arguments: map[string]any{}},
	} {
		res, err := cs.CallTool(t.Context(), call)
		require.NoError(t, err)
		require.False(t, res.IsError, "%s: %+v %s", call.Name, res.Content, stderr.String())
	}
	require.NoError(t, cs.Close())
	require.NoError(t, stdinW.Close())
	require.Equal(t, exitOK, <-code, stderr.String())
	require.Equal(t, 1, d.count(t, `SELECT count(*) FROM outbox WHERE idempotency_key = 'by-agent'`))
}
