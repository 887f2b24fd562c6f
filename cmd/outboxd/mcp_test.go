package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

func mcpTokensEnv(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return `OUTBOX_API_TOKENS=[{"name":"agent","sha256":"` + hex.EncodeToString(sum[:]) + `","connectors":["webhook","payment"]}]`
}

// TestMCPCommand runs `outboxd mcp` with pipes for stdin and stdout and talks to it
// with the SDK's client: list the tools, propose, read back.
func TestMCPCommand(t *testing.T) {
	t.Parallel()
	const secret = "obx_cmd-test-secret"
	d := newOpsDB(t, mcpTokensEnv(secret), "OUTBOX_APPROVAL_REQUIRED=payment", "OUTBOX_MCP_TOKEN="+secret)

	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	var stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(t.Context(), []string{"mcp"}, d.environ, stdinR, stdoutW, &stderr)
		_ = stdoutW.Close()
	}()

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).
		Connect(t.Context(), &mcp.IOTransport{Reader: stdoutR, Writer: stdinW}, nil)
	require.NoError(t, err, stderr.String())

	tools, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	require.ElementsMatch(t, []string{"propose_intent", "get_intent", "list_intents"}, names)

	propose := func(args map[string]any) map[string]any {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "propose_intent", Arguments: args})
		require.NoError(t, err)
		require.False(t, res.IsError, "%+v", res.Content)
		b, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(b, &out))
		return out["intent"].(map[string]any)
	}
	in := propose(map[string]any{
		"connector": "webhook", "key_parts": []string{"run-1", "notify"}, "payload": map[string]any{"n": 1},
		"reason": "tell the CRM",
	})
	require.Equal(t, outbox.Key("run-1", "notify"), in["key"])
	require.Equal(t, "agent", in["created_by"])
	require.Equal(t, 1, d.count(t, `SELECT count(*) FROM outbox WHERE created_by = 'agent'`))

	pay := propose(map[string]any{
		"connector": "payment", "key": "refund-1",
		"payload": map[string]any{"operation": "refund.create", "params": map[string]any{"payment_intent": "pi_1"}},
	})
	require.Equal(t, outbox.StatusAwaitingApproval, pay["status"])

	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "get_intent", Arguments: map[string]any{"key": "refund-1"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Contains(t, res.Content[0].(*mcp.TextContent).Text, "awaiting_approval")

	// The client closing stdin ends the command with exit 0.
	require.NoError(t, cs.Close())
	require.Equal(t, exitOK, <-code, stderr.String())
	logs := stderr.String()
	require.Contains(t, logs, "outboxd mcp serving on stdio")
	require.Contains(t, logs, "tell the CRM")
	require.NotContains(t, logs, secret)
}

func TestMCPCommandUsage(t *testing.T) {
	t.Parallel()
	const secret = "obx_cmd-usage-secret"
	for name, tc := range map[string]struct {
		environ []string
		want    string
	}{
		"NoToken": {
			environ: []string{"OUTBOX_DATABASE_URL=postgres://127.0.0.1:1/x", mcpTokensEnv(secret)},
			want:    "OUTBOX_MCP_TOKEN",
		},
		"UnknownToken": {
			environ: []string{"OUTBOX_DATABASE_URL=postgres://127.0.0.1:1/x", mcpTokensEnv(secret), "OUTBOX_MCP_TOKEN=obx_not-configured"},
			want:    "OUTBOX_MCP_TOKEN matches none of OUTBOX_API_TOKENS",
		},
		"BadTokens": {
			environ: []string{"OUTBOX_DATABASE_URL=postgres://127.0.0.1:1/x", `OUTBOX_API_TOKENS=[{"name":""}]`, "OUTBOX_MCP_TOKEN=" + secret},
			want:    "OUTBOX_API_TOKENS",
		},
		"NoDatabase": {
			environ: []string{mcpTokensEnv(secret), "OUTBOX_MCP_TOKEN=" + secret},
			want:    "OUTBOX_DATABASE_URL",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := runCLI(t, tc.environ, strings.NewReader(""), "mcp")
			require.Equal(t, exitUsage, code, errOut)
			require.Empty(t, out)
			require.Contains(t, errOut, tc.want)
			require.NotContains(t, errOut, "obx_not-configured")
			require.NotContains(t, errOut, secret)
		})
	}
}

// outboxd mcp on a database nobody has migrated stops at start with the word to run
// outboxd migrate, as serve does. It served, and every call failed with "internal
// error; calling again with the same key is safe", which the agent would retry for ever
// while only the log, which an MCP client seldom shows, said why.
func TestMCPCommandRefusesAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	const secret = "obx_cmd-unmigrated-secret"
	d := newOpsDB(t, mcpTokensEnv(secret), "OUTBOX_MCP_TOKEN="+secret)
	_, err := d.pool.Exec(t.Context(), `DROP SCHEMA public CASCADE; CREATE SCHEMA public`)
	require.NoError(t, err)

	code, out, errOut := d.cli(t, "", "mcp")
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, errOut, "outboxd: the database has no outbox schema: run outboxd migrate first\n")
	require.Empty(t, out)
}
