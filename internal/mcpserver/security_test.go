package mcpserver_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/api"
	"github.com/outboxd/outboxd/internal/mcpserver"
)

// A JSON-RPC batch on /mcp must not turn one request of the token's rate limit into
// many tool calls: OUTBOX_API_RATE limits each token's requests to the API and /mcp
// together, and a 1 MiB batch holds thousands of propose_intent calls.
func TestMCPHTTPBatchDoesNotBypassRateLimit(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	h := api.New(b.svc, &api.Config{Rate: 2}) // a burst of 2 requests, then 2 per second
	mh := mcpserver.Handler(b.svc, nil)
	mux := http.NewServeMux()
	mux.Handle("/mcp", h.Limit(mh))
	mux.Handle("/unlimited", mh) // only to end the session at the end
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	post := func(session, body string) (*http.Response, string) {
		return rawMCP(t, ctx, srv, http.MethodPost, session, "2025-03-26", body)
	}

	resp, raw := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, raw)
	session := resp.Header.Get("Mcp-Session-Id")
	require.NotEmpty(t, session)
	defer func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, srv.URL+"/unlimited", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+agentSecret)
		req.Header.Set("Mcp-Session-Id", session)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
	}()

	const calls = 20
	msgs := []string{`{"jsonrpc":"2.0","method":"notifications/initialized"}`}
	for i := range calls {
		msgs = append(msgs, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"propose_intent","arguments":{"connector":"webhook","key":"batch-%d","payload":{"n":%d}}}}`, i+2, i, i))
	}
	resp, raw = post(session, "["+strings.Join(msgs, ",")+"]")
	t.Logf("batch answered %d: %.300s", resp.StatusCode, raw)

	// Two requests were admitted (initialize and the batch): at most one tool call may
	// have run, not twenty.
	require.LessOrEqual(t, b.count(t, `idempotency_key LIKE 'batch-%'`), 1)
}

// A body over the API's limit still answers 413 once the batch check has read it.
func TestMCPHTTPBodyLimitAfterBatchCheck(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	mux := http.NewServeMux()
	mux.Handle("/mcp", api.New(b.svc, &api.Config{MaxBody: 64}).Limit(mcpserver.Handler(b.svc, nil)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/mcp",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"`+strings.Repeat("x", 200)+`"}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+agentSecret)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
}

// outboxd serve listens on 127.0.0.1 by default, so a reverse proxy on the same host
// (Caddy, nginx with proxy_set_header Host $host, a sidecar) forwards requests there with
// the public Host. The SDK's DNS rebinding check refused those on /mcp with a plain-text
// 403 while the intent API answered them; the bearer token every request needs is what
// keeps a rebinding page out, as it cannot send one.
func TestMCPHTTPBehindLocalReverseProxy(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	srv := httptest.NewServer(mcpserver.Handler(b.svc, nil)) // on 127.0.0.1
	t.Cleanup(srv.Close)
	initialize := func(bearer string) *http.Response {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/mcp",
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`))
		require.NoError(t, err)
		req.Host = "outboxd.example.com"
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	resp := initialize(agentSecret)
	raw, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	session := resp.Header.Get("Mcp-Session-Id")
	require.NotEmpty(t, session)
	// End the session, which would otherwise outlive the test.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodDelete, srv.URL+"/mcp", nil)
	require.NoError(t, err)
	req.Host = "outboxd.example.com"
	req.Header.Set("Authorization", "Bearer "+agentSecret)
	req.Header.Set("Mcp-Session-Id", session)
	del, err := srv.Client().Do(req)
	require.NoError(t, err)
	_ = del.Body.Close()
	require.Less(t, del.StatusCode, 300)

	// Without a token, the same request is refused.
	require.Equal(t, http.StatusUnauthorized, initialize("").StatusCode)
}

// A tool call over OUTBOX_API_MAX_BODY (a large payload) fails that call, not the
// agent's session: the 413 carries a JSON-RPC error for the call, saying what the limit
// is. As plain text it was not the answer to any request, so the SDK's client took the
// connection for broken and closed it, failing every later call ("client is closing")
// and telling the agent only "Request Entity Too Large".
func TestMCPHTTPBodyOverTheLimitFailsOnlyThatCall(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	mux := http.NewServeMux()
	mux.Handle("/mcp", api.New(b.svc, &api.Config{MaxBody: 4096}).Limit(mcpserver.Handler(b.svc, nil)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(t.Context(),
		&mcp.StreamableClientTransport{
			Endpoint:   srv.URL + "/mcp",
			HTTPClient: &http.Client{Transport: bearerTransport{token: agentSecret}},
			MaxRetries: -1,
		}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })

	_, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: mcpserver.ToolPropose, Arguments: map[string]any{
		"connector": "webhook", "key": "too-big", "payload": map[string]any{"pad": strings.Repeat("x", 5000)},
	}})
	require.Error(t, err)
	require.Contains(t, err.Error(), "4096 bytes")
	require.Contains(t, err.Error(), "OUTBOX_API_MAX_BODY")
	require.Zero(t, b.count(t, `true`))

	// The session goes on.
	out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "webhook", "key": "small", "payload": map[string]any{"pad": "x"},
	}))
	require.True(t, out.Inserted)
}
