package mcpserver_test

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/mcpserver"
)

// list_intents' limit is the intent API's: a positive integer, and one larger than a
// page holds reads a full page, past the largest int too. Such a limit (1e30, or
// 99999999999999999999 as sent) failed the call with the decoder's "cannot unmarshal
// number 1e+30 into Go struct field ListInput.limit of type int", and a negative one
// with "Limit: -1 is negative": refusals an agent cannot map to the argument, where
// GET /v1/intents?limit= lists a page. A limit that is no positive integer is refused
// in one sentence naming the argument and what it may be.
func TestListLimitIsTheAPIs(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	_, err := b.pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('a', 'webhook', '{}'), ('b', 'webhook', '{}')`)
	require.NoError(t, err)
	cs := b.connect(t, "agent")
	list := func(limit string) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: mcpserver.ToolList,
			Arguments: json.RawMessage(`{"limit":` + limit + `}`)})
		require.NoError(t, err)
		return res
	}

	for _, l := range []string{"1e30", "99999999999999999999", "9223372036854775807", "5000", "2", "0"} {
		out := ok[mcpserver.ListOutput](t, list(l))
		require.Len(t, out.Intents, 2, l)
	}
	require.Len(t, ok[mcpserver.ListOutput](t, list("1")).Intents, 1)
	for _, l := range []string{"-1", "-1e30", "-99999999999999999999"} {
		msg := toolErr(t, list(l))
		require.Contains(t, msg, "limit must be a positive integer", l)
		require.Contains(t, msg, "at most 1000", l)
		require.NotContains(t, msg, "unmarshal", l)
		require.NotContains(t, msg, "ListInput", l)
	}
}
