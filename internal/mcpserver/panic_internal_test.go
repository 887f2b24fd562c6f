package mcpserver

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// The SDK runs a tool's handler on a goroutine of its own without recovering: a panic in
// one ended the whole process, and with it the relay and the intent API that `outboxd
// serve` runs beside MCP. The call now fails with an error, the panic is logged, and the
// session goes on answering.
func TestToolPanicFailsTheCallNotTheProcess(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s := mcp.NewServer(&mcp.Implementation{Name: "outboxd", Version: "test"}, nil)
	type in struct {
		Boom bool `json:"boom"`
	}
	type out struct {
		OK bool `json:"ok"`
	}
	addTool(s, log, &mcp.Tool{Name: "maybe_panic"}, func(_ context.Context, _ *mcp.CallToolRequest, args in) (*mcp.CallToolResult, out, error) {
		if args.Boom {
			var m map[string]int
			m["boom"] = 1 // a nil map: the kind of bug that panics
		}
		return nil, out{OK: true}, nil
	})
	cs := connectInMemory(t, s)

	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "maybe_panic", Arguments: map[string]any{"boom": true}})
	require.NoError(t, err)
	require.True(t, res.IsError)
	require.Len(t, res.Content, 1)
	require.Contains(t, res.Content[0].(*mcp.TextContent).Text, "maybe_panic failed inside outboxd")
	require.Contains(t, res.Content[0].(*mcp.TextContent).Text, "get_intent")
	require.Contains(t, logs.String(), "MCP tool call panicked")
	require.Contains(t, logs.String(), "assignment to entry in nil map")

	res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "maybe_panic", Arguments: map[string]any{"boom": false}})
	require.NoError(t, err, "the session still answers")
	require.False(t, res.IsError)
}

// connectInMemory opens a client session to server over in-memory transports, closed
// when t ends.
func connectInMemory(t *testing.T, server *mcp.Server) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := server.Connect(t.Context(), st, nil)
	require.NoError(t, err)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(t.Context(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}
