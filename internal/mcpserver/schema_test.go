package mcpserver_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/mcpserver"
)

// Every argument of every tool has one JSON type. propose_intent showed key_parts as
// "type": ["null", "array"], which Gemini's function declarations do not take: an agent
// on Gemini (gemini-cli, opencode, Copilot CLI with Gemini) had every request refused
// with 400 INVALID_ARGUMENT once outboxd's tools were listed, whatever it asked. An
// argument given as null is still taken as not given.
func TestToolArgumentsHaveOneType(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	res, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	require.Len(t, res.Tools, 3)
	for _, tool := range res.Tools {
		raw, err := json.Marshal(tool.InputSchema)
		require.NoError(t, err)
		var schema struct {
			Properties map[string]map[string]any `json:"properties"`
		}
		require.NoError(t, json.Unmarshal(raw, &schema))
		for name, prop := range schema.Properties {
			require.IsType(t, "", prop["type"], "%s: %s has type %v", tool.Name, name, prop["type"])
		}
	}

	out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "webhook", "key": "null-parts", "key_parts": nil, "payload": map[string]any{},
	}))
	require.Equal(t, "null-parts", out.Intent.Key)
}
