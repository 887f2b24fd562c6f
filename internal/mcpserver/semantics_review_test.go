package mcpserver_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/mcpserver"
)

// A key that no row can hold is the agent's to change: the tool error must not tell it
// to propose again with that same key, which would fail the same way for ever.
func TestProposeBadKeyAsksForAnotherKey(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	for name, key := range map[string]string{"long": strings.Repeat("k", 256), "nul": "a\x00b"} {
		msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "webhook", "key": key, "payload": map[string]any{},
		}))
		require.NotContains(t, msg, "same key", name)
		require.Contains(t, msg, "key_parts", name)
		require.Contains(t, msg, "nothing was written", name)
	}
	require.Equal(t, 0, b.count(t, `true`))
}
