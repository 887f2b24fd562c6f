package mcpserver_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Delivered and canceled intents are deleted after the outbox's retention period, so
// get_intent's "not found" for a key the agent proposed before does not mean the
// operation never happened; the tools must say so alike, and name the same rows as
// deleted (not "finished" ones: dead intents are kept).
func TestNotFoundDoesNotReadAsNeverProposed(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	msg := toolErr(t, call(t, cs, "get_intent", map[string]any{"key": "order-1"}))
	require.Contains(t, msg, "not found")
	require.Contains(t, msg, "retention period")
	require.Contains(t, msg, "delivered and canceled")

	tools, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	require.Len(t, tools.Tools, 3)
	for _, tool := range tools.Tools {
		require.NotContains(t, tool.Description, "finished intents are deleted", tool.Name)
		if tool.Name == "get_intent" || tool.Name == "propose_intent" {
			require.Contains(t, tool.Description, "delivered and canceled intents are deleted after", tool.Name)
			require.Contains(t, strings.ToLower(tool.Description), "not found", tool.Name)
		}
	}
}
