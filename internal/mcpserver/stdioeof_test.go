package mcpserver_test

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/mcpserver"
)

// A client that writes its requests and closes stdin at once (`outboxd mcp <
// calls.jsonl`, a one-shot pipe, an MCP client ending its session) gets an answer to
// every request it sent: the SDK took end of input for the end of the session, cancelled
// the calls still running and wrote no more answers, so the output held the initialize
// answer at most, and a proposal was neither answered nor, cancelled mid-call, made.
func TestMCPStdioAnswersEveryRequestSentBeforeEndOfInput(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	tok, err := b.svc.Policy.Authenticate(agentSecret)
	require.NoError(t, err)

	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":"three","method":"tools/call","params":{"name":"propose_intent","arguments":{"connector":"webhook","key":"eof-1","payload":{"n":1}}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_intent","arguments":{"key":"eof-1"}}}`,
	}, "\n") + "\n"
	var out bytes.Buffer
	require.NoError(t, mcpserver.ServeStdio(t.Context(), b.svc, tok, strings.NewReader(in), &out, nil))

	answered := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &msg), line)
		require.Nil(t, msg.Error, line)
		answered[string(msg.ID)] = string(msg.Result)
	}
	require.Len(t, answered, 4, out.String())
	require.Contains(t, answered, `"three"`)
	require.Contains(t, answered[`"three"`], `\"key\":\"eof-1\"`)
	require.Equal(t, 1, b.count(t, "idempotency_key = 'eof-1'"))
}

// failingWriter is a client that stopped reading: every write fails.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

// Waiting for answers after the end of input stops when they cannot be written: a client
// that closed both ends leaves no session behind, however long a call may take.
func TestMCPStdioDoesNotWaitForAnswersNoOneReads(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	tok, err := b.svc.Policy.Authenticate(agentSecret)
	require.NoError(t, err)

	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"propose_intent","arguments":{"connector":"webhook","key":"eof-2","payload":{"n":1}}}}`,
	}, "\n") + "\n"
	done := make(chan error, 1)
	go func() {
		done <- mcpserver.ServeStdio(t.Context(), b.svc, tok, strings.NewReader(in), failingWriter{},
			&mcpserver.Config{CallTimeout: time.Hour})
	}()
	select {
	case <-done: // whatever it says of the broken output
	case <-time.After(30 * time.Second):
		t.Fatal("ServeStdio still waits for answers its client cannot read")
	}
}
