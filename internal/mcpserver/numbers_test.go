package mcpserver_test

import (
	"cmp"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/mcpserver"
)

// The tools' output went through the SDK's check, which decodes it into map[string]any
// and sends what it decoded: a payload's integer past 2^53 (an amount, a Discord or
// Twitter id) lost digits, so the agent read another number than the one stored and
// sent. The tools show the payload as it is stored.
func TestToolsShowPayloadNumbersAsStored(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	_, err := b.pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload) VALUES
    ('big', 'webhook:crm', '{"amount": 12345678901234567891}')`)
	require.NoError(t, err)
	cs := b.connect(t, "agent")

	res := call(t, cs, mcpserver.ToolGet, map[string]any{"key": "big"})
	require.False(t, res.IsError, text(res))
	require.Contains(t, text(res), `"amount":12345678901234567891`)

	res = call(t, cs, mcpserver.ToolList, map[string]any{})
	require.False(t, res.IsError, text(res))
	require.Contains(t, text(res), `"amount":12345678901234567891`)

	res = call(t, cs, mcpserver.ToolPropose, map[string]any{
		"key": "proposed", "connector": "webhook:crm", "payload": map[string]any{"id": 1},
	})
	require.False(t, res.IsError, text(res))
}

// propose_intent's arguments were checked by decoding them into map[string]any, where a
// payload's number past a float64's range (1e400, which jsonb stores and the intent API
// takes) failed the call with "cannot unmarshal number 1e400 into Go value of type
// float64". The payload is read from the raw arguments as sent; its numbers are left to
// the outbox's checks, as the API leaves them. (Raw JSON-RPC over HTTP: the SDK's Go
// client cannot read such a number in the answer either.)
func TestProposeTakesNumbersPastFloat64(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	srv := httptest.NewServer(mcpserver.Handler(b.svc, nil))
	t.Cleanup(srv.Close)
	session := ""
	post := func(method, body string) string {
		// Without cancel: the DELETE that ends the session runs at cleanup.
		resp, raw := rawMCP(t, context.WithoutCancel(t.Context()), srv, method, session, "2025-06-18", body)
		require.Less(t, resp.StatusCode, 300, "%s", raw)
		session = cmp.Or(session, resp.Header.Get("Mcp-Session-Id"))
		return raw
	}
	post(http.MethodPost, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`)
	t.Cleanup(func() { post(http.MethodDelete, "") })
	post(http.MethodPost, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	propose := func(key, payload string) string {
		return post(http.MethodPost, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"propose_intent","arguments":`+
			`{"connector":"webhook","key":"`+key+`","payload":`+payload+`}}}`)
	}

	answer := propose("huge", `{"n":1e400,"m":[-2e-400]}`)
	require.NotContains(t, answer, `"isError":true`)
	require.Contains(t, answer, "Created intent huge")
	require.Equal(t, 1, b.count(t, `idempotency_key = 'huge' AND payload = '{"n":1e400,"m":[-2e-400]}'::jsonb`))

	// What the outbox refuses is still refused, in its words, and the payload must still
	// be an object.
	require.Contains(t, propose("too-huge", `{"n":1e999999}`), "numeric cannot hold")
	require.Contains(t, propose("array", `[1e400]`), "validating")
	require.Zero(t, b.count(t, `idempotency_key IN ('too-huge', 'array')`))
}

// rawMCP sends body, a JSON-RPC message, with method to srv's /mcp as the agent token,
// in session (at protocol version) when session is set, and returns the answer and its
// body: what a client the SDK's cannot stand for sends.
func rawMCP(t *testing.T, ctx context.Context, srv *httptest.Server, method, session, version, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+"/mcp", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+agentSecret)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", version)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp, string(raw)
}
