package mcpserver_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/mcpserver"
)

// The intent API refuses a new intent under the key "." or "..": no URL path can name
// it (/v1/intents/.. is cleaned away), so the intent could never be read, approved,
// rejected or canceled through the API. propose_intent took it, and a payment an agent
// proposed so waited for an approval that no approver using the API could give or
// refuse. Proposed through MCP, such a key is refused as the API refuses it, with
// nothing written.
func TestProposeDotKeyIsRefusedAsTheAPIRefusesIt(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	for _, key := range []string{".", ".."} {
		res := call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "payment", "key": key,
			"payload": map[string]any{"operation": "payment_intent.create", "params": map[string]any{"amount": 100, "currency": "eur"}},
		})
		require.True(t, res.IsError, "%q was taken: %s", key, text(res))
		require.Contains(t, text(res), "nothing was written", key)
	}
	require.Zero(t, b.count(t, "true"))
}
