package mcpserver_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/mcpserver"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Secrets of the test tokens.
const (
	agentSecret = "obx_agent-secret"
	mailSecret  = "obx_mail-secret"
)

func hashOf(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// testPolicy has an agent that may use webhooks, slack and payment (which needs
// approval), and a mailer that may only send email.
func testPolicy() *intent.Policy {
	return &intent.Policy{
		Tokens: []intent.Token{
			{Name: "agent", SHA256: hashOf(agentSecret), Connectors: []string{"webhook:*", "slack", "payment"}},
			{Name: "mailer", SHA256: hashOf(mailSecret), Connectors: []string{"email"}},
		},
		ApprovalRequired: []string{"payment"},
	}
}

type testBundle struct {
	pool *pgxpool.Pool
	svc  *intent.Service
}

func setupService(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.DB(t)
	return &testBundle{pool: pool, svc: &intent.Service{Pool: pool, Policy: testPolicy()}}
}

// connect opens an MCP client session, over in-memory transports, to a server whose
// calls act as the token named tokenName.
func (b *testBundle) connect(t *testing.T, tokenName string) *mcp.ClientSession {
	t.Helper()
	var tok *intent.Token
	for i := range b.svc.Policy.Tokens {
		if b.svc.Policy.Tokens[i].Name == tokenName {
			tok = &b.svc.Policy.Tokens[i]
		}
	}
	require.NotNil(t, tok, tokenName)
	return connectAs(t, b.svc, tok, nil)
}

// connectAs opens an MCP client session, over in-memory transports, to a server of svc
// (under cfg) whose calls act as tok.
func connectAs(t *testing.T, svc *intent.Service, tok *intent.Token, cfg *mcpserver.Config) *mcp.ClientSession {
	t.Helper()
	server := mcpserver.New(svc, func(context.Context, *mcp.CallToolRequest) (*intent.Token, error) { return tok, nil }, cfg)
	return mcpserver.ConnectInMemory(t, server)
}

func (b *testBundle) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.WithoutCancel(t.Context()), `SELECT count(*) FROM outbox WHERE `+where, args...).Scan(&n))
	return n
}

// call calls a tool and returns its result; a protocol error fails the test.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err)
	return res
}

// ok requires a successful tool result and decodes its structured content into v.
func ok[T any](t *testing.T, res *mcp.CallToolResult) T {
	t.Helper()
	require.False(t, res.IsError, "tool error: %s", text(res))
	b, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	var v T
	require.NoError(t, json.Unmarshal(b, &v), string(b))
	return v
}

// toolErr requires a tool error and returns its text.
func toolErr(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	require.True(t, res.IsError, "want a tool error, got %s", text(res))
	return text(res)
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func TestMCPTools(t *testing.T) {
	t.Parallel()

	t.Run("ListToolsHasSchemas", func(t *testing.T) {
		t.Parallel()
		b := setupService(t)
		cs := b.connect(t, "agent")
		res, err := cs.ListTools(t.Context(), nil)
		require.NoError(t, err)
		byName := map[string]*mcp.Tool{}
		for _, tool := range res.Tools {
			byName[tool.Name] = tool
		}
		require.Len(t, byName, 3)
		for name, props := range map[string][]string{
			mcpserver.ToolPropose: {"connector", "key", "key_parts", "payload", "reason", "ordering_key", "not_before"},
			mcpserver.ToolGet:     {"key"},
			mcpserver.ToolList:    {"status", "connector", "limit", "after"},
		} {
			tool := byName[name]
			require.NotNil(t, tool, name)
			require.NotEmpty(t, tool.Description, name)
			b, err := json.Marshal(tool.InputSchema)
			require.NoError(t, err)
			var schema struct {
				Type       string                     `json:"type"`
				Properties map[string]json.RawMessage `json:"properties"`
				Required   []string                   `json:"required"`
			}
			require.NoError(t, json.Unmarshal(b, &schema))
			require.Equal(t, "object", schema.Type, name)
			for _, p := range props {
				require.Contains(t, schema.Properties, p, name)
			}
			if name == mcpserver.ToolPropose {
				require.ElementsMatch(t, []string{"connector", "payload"}, schema.Required)
				require.Contains(t, string(schema.Properties["payload"]), `"object"`)
			}
		}
		require.Contains(t, byName[mcpserver.ToolPropose].Description, "same key")
	})

	t.Run("ProposeIsIdempotent", func(t *testing.T) {
		t.Parallel()
		b := setupService(t)
		cs := b.connect(t, "agent")
		args := map[string]any{
			"connector": "webhook", "key": "run-1/notify/crm",
			"payload": map[string]any{"order": 42, "big": json.Number("12345678901234567890")},
			"reason":  "the order shipped",
		}
		first := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, args))
		require.True(t, first.Inserted)
		require.False(t, first.Replayed)
		require.Equal(t, "run-1/notify/crm", first.Intent.Key)
		require.Equal(t, outbox.StatusPending, first.Intent.Status)
		require.Equal(t, "agent", first.Intent.CreatedBy)
		require.Equal(t, "the order shipped", first.Reason)
		require.Contains(t, first.Message, "get_intent")
		require.Equal(t, 1, b.count(t, `idempotency_key = $1 AND created_by = 'agent'`, "run-1/notify/crm"))
		// The payload is stored as sent: a number past 2^53 keeps its digits.
		require.Equal(t, 1, b.count(t, `payload->>'big' = '12345678901234567890'`))

		// The same decision again: the same intent, nothing new written.
		again := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, args))
		require.False(t, again.Inserted)
		require.True(t, again.Replayed)
		require.Equal(t, first.Intent.Key, again.Intent.Key)
		require.Equal(t, first.Intent.CreatedAt, again.Intent.CreatedAt)
		require.Equal(t, 1, b.count(t, `true`))

		// A different decision under the same key: a tool error naming the key.
		args["payload"] = map[string]any{"order": 43}
		msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, args))
		require.Contains(t, msg, `"run-1/notify/crm"`)
		require.Contains(t, msg, "different decision")
		require.Equal(t, 1, b.count(t, `true`))
		require.Equal(t, 1, b.count(t, `payload->>'order' = '42'`))

		// A token that may not see that intent learns nothing of it from the conflict.
		other := toolErr(t, call(t, b.connect(t, "mailer"), mcpserver.ToolPropose, map[string]any{
			"connector": "email", "key": "run-1/notify/crm", "payload": map[string]any{"to": "a@example.com", "subject": "s", "text": "t"},
		}))
		require.Contains(t, other, "different decision")
		require.NotContains(t, other, "webhook")
		require.NotContains(t, other, "created")
	})

	t.Run("KeyParts", func(t *testing.T) {
		t.Parallel()
		b := setupService(t)
		cs := b.connect(t, "agent")
		parts := []string{"run-7", "post-summary", "#ops"}
		out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "slack", "key_parts": parts, "payload": map[string]any{"channel": "C0OPS", "text": "done"},
		}))
		require.Equal(t, outbox.Key(parts...), out.Intent.Key)
		require.Equal(t, 1, b.count(t, `idempotency_key = $1`, outbox.Key(parts...)))

		// Neither key nor parts, or both: refused, nothing written.
		msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "slack", "payload": map[string]any{"channel": "C0OPS", "text": "x"},
		}))
		require.Contains(t, msg, "key_parts")
		msg = toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "slack", "key": "k", "key_parts": parts, "payload": map[string]any{"channel": "C0OPS", "text": "x"},
		}))
		require.Contains(t, msg, "not both")
		require.Equal(t, 1, b.count(t, `true`))
	})

	t.Run("Refusals", func(t *testing.T) {
		t.Parallel()
		b := setupService(t)
		cs := b.connect(t, "agent")
		// A connector outside the token.
		msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "email", "key": "mail-1", "payload": map[string]any{"to": "a@example.com", "subject": "s", "text": "t"},
		}))
		require.Contains(t, msg, `"email"`)
		require.Contains(t, msg, "forbidden")
		// A payload invalid for its kind.
		msg = toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "slack", "key": "slack-1", "payload": map[string]any{"text": 1},
		}))
		require.Contains(t, msg, "invalid")
		// Arguments the schema refuses: no payload, an unknown field.
		toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{"connector": "webhook", "key": "w-1"}))
		toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "webhook", "key": "w-2", "payload": map[string]any{}, "amount": 5,
		}))
		require.Equal(t, 0, b.count(t, `true`))
	})

	t.Run("NotBefore", func(t *testing.T) {
		t.Parallel()
		b := setupService(t)
		cs := b.connect(t, "agent")
		// The schema says an RFC 3339 string; anything else is a tool error saying so,
		// not a Go decoding error, and nothing is written.
		for _, nb := range []string{"tomorrow", "2030-01-02", "2030-01-02 15:04:05"} {
			msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
				"connector": "webhook", "key": "later-1", "payload": map[string]any{}, "not_before": nb,
			}))
			require.Contains(t, msg, "RFC 3339", nb)
			require.Contains(t, msg, "not_before", nb)
			require.NotContains(t, msg, "Go struct", nb)
			require.NotContains(t, msg, "ProposeInput", nb)
		}
		require.Equal(t, 0, b.count(t, `true`))

		out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "webhook", "key": "later-1", "payload": map[string]any{}, "not_before": "2030-01-02T15:04:05+01:00",
		}))
		require.True(t, out.Intent.NextAttemptAt.Equal(time.Date(2030, 1, 2, 14, 4, 5, 0, time.UTC)), out.Intent.NextAttemptAt)
	})

	t.Run("ApprovalRequired", func(t *testing.T) {
		t.Parallel()
		b := setupService(t)
		cs := b.connect(t, "agent")
		out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": "payment", "key_parts": []string{"invoice-9", "refund"},
			"payload": map[string]any{"operation": "refund.create", "params": map[string]any{"payment_intent": "pi_1"}},
			"reason":  "customer asked for a refund",
		}))
		require.Equal(t, outbox.StatusAwaitingApproval, out.Intent.Status)
		require.Contains(t, out.Message, "approval")

		got := ok[mcpserver.GetOutput](t, call(t, cs, mcpserver.ToolGet, map[string]any{"key": out.Intent.Key}))
		require.Equal(t, outbox.StatusAwaitingApproval, got.Intent.Status)
		require.Equal(t, 0, got.Intent.Attempts)
	})

	t.Run("GetIntent", func(t *testing.T) {
		t.Parallel()
		b := setupService(t)
		_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, last_error, result)
			VALUES ('done-1', 'webhook', '{"a":1}', 'delivered', 2, 'receiver answered 503', '{"status_code":200}'),
			       ('mail-1', 'email', '{"to":"a@example.com","subject":"s","text":"t"}', 'pending', 0, NULL, NULL)`)
		require.NoError(t, err)
		cs := b.connect(t, "agent")
		got := ok[mcpserver.GetOutput](t, call(t, cs, mcpserver.ToolGet, map[string]any{"key": "done-1"}))
		require.Equal(t, outbox.StatusDelivered, got.Intent.Status)
		require.Equal(t, 2, got.Intent.Attempts)
		require.Equal(t, "receiver answered 503", got.Intent.LastError)
		require.JSONEq(t, `{"status_code":200}`, mustJSON(t, got.Intent.Result))
		require.Contains(t, got.Message, "delivered")

		// Unknown, and outside the token's connectors: both not found.
		require.Contains(t, toolErr(t, call(t, cs, mcpserver.ToolGet, map[string]any{"key": "nope"})), "not found")
		require.Contains(t, toolErr(t, call(t, cs, mcpserver.ToolGet, map[string]any{"key": "mail-1"})), "not found")
	})

	t.Run("ListIntents", func(t *testing.T) {
		t.Parallel()
		b := setupService(t)
		_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status) VALUES
			('w-1', 'webhook', '{}', 'pending'),
			('w-2', 'webhook:crm', '{}', 'dead'),
			('s-1', 'slack', '{"channel":"#a","text":"t"}', 'pending'),
			('m-1', 'email', '{"to":"a@example.com","subject":"s","text":"t"}', 'pending')`)
		require.NoError(t, err)
		cs := b.connect(t, "agent")
		keys := func(out mcpserver.ListOutput) []string {
			var ks []string
			for _, in := range out.Intents {
				ks = append(ks, in.Key)
			}
			return ks
		}
		all := ok[mcpserver.ListOutput](t, call(t, cs, mcpserver.ToolList, map[string]any{}))
		require.ElementsMatch(t, []string{"w-1", "w-2", "s-1"}, keys(all))

		pending := ok[mcpserver.ListOutput](t, call(t, cs, mcpserver.ToolList, map[string]any{"status": "pending"}))
		require.ElementsMatch(t, []string{"w-1", "s-1"}, keys(pending))
		several := ok[mcpserver.ListOutput](t, call(t, cs, mcpserver.ToolList, map[string]any{"status": "pending, dead", "connector": "webhook:crm"}))
		require.Equal(t, []string{"w-2"}, keys(several))

		// Paging: two pages of two and one.
		p1 := ok[mcpserver.ListOutput](t, call(t, cs, mcpserver.ToolList, map[string]any{"limit": 2}))
		require.Len(t, p1.Intents, 2)
		require.NotEmpty(t, p1.Next)
		p2 := ok[mcpserver.ListOutput](t, call(t, cs, mcpserver.ToolList, map[string]any{"limit": 2, "after": p1.Next}))
		require.ElementsMatch(t, []string{"w-1", "w-2", "s-1"}, append(keys(p1), keys(p2)...))

		require.Contains(t, toolErr(t, call(t, cs, mcpserver.ToolList, map[string]any{"connector": "email"})), "forbidden")
		require.Contains(t, toolErr(t, call(t, cs, mcpserver.ToolList, map[string]any{"status": "lost"})), "lost")

		mailer := b.connect(t, "mailer")
		mail := ok[mcpserver.ListOutput](t, call(t, mailer, mcpserver.ToolList, map[string]any{}))
		require.Equal(t, []string{"m-1"}, keys(mail))
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestMCPStdio(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	tok, err := b.svc.Policy.Authenticate(agentSecret)
	require.NoError(t, err)

	// Two pipes stand in for the command's stdin and stdout.
	clientToServer, serverIn := io.Pipe()
	serverOut, serverToClient := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- mcpserver.ServeStdio(t.Context(), b.svc, tok, clientToServer, serverToClient, nil)
		_ = serverToClient.Close()
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).
		Connect(t.Context(), &mcp.IOTransport{Reader: serverOut, Writer: serverIn}, nil)
	require.NoError(t, err)

	out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "webhook", "key_parts": []string{"run-3", "notify"}, "payload": map[string]any{"n": 1},
	}))
	require.Equal(t, "agent", out.Intent.CreatedBy)
	got := ok[mcpserver.GetOutput](t, call(t, cs, mcpserver.ToolGet, map[string]any{"key": out.Intent.Key}))
	require.Equal(t, outbox.StatusPending, got.Intent.Status)

	// The client closing its end ends the session cleanly.
	require.NoError(t, cs.Close())
	require.NoError(t, <-done)
}

// bearerTransport adds an Authorization header to every request.
type bearerTransport struct{ token string }

func (bt bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+bt.token)
	return http.DefaultTransport.RoundTrip(r)
}

func TestMCPHTTP(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpserver.Handler(b.svc, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	t.Run("NoBearer", func(t *testing.T) {
		t.Parallel()
		for _, header := range []string{"", "Bearer obx_wrong", "Basic abc"} {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/mcp",
				strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if header != "" {
				req.Header.Set("Authorization", header)
			}
			resp, err := srv.Client().Do(req)
			require.NoError(t, err)
			var body struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			_ = resp.Body.Close()
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, header)
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			require.Equal(t, "unauthorized", body.Error.Code)
			require.NotEmpty(t, body.Error.Message)
		}
		// Without a token, the client cannot even connect.
		_, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(t.Context(),
			&mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", MaxRetries: -1}, nil)
		require.Error(t, err)
	})

	t.Run("ValidBearer", func(t *testing.T) {
		t.Parallel()
		connect := func(secret string) *mcp.ClientSession {
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(t.Context(),
				&mcp.StreamableClientTransport{
					Endpoint:   srv.URL + "/mcp",
					HTTPClient: &http.Client{Transport: bearerTransport{token: secret}},
					MaxRetries: -1,
				}, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cs.Close() })
			return cs
		}
		agent := connect(agentSecret)
		out := ok[mcpserver.ProposeOutput](t, call(t, agent, mcpserver.ToolPropose, map[string]any{
			"connector": "webhook:crm", "key": "http-1", "payload": map[string]any{"n": 1},
		}))
		require.True(t, out.Inserted)
		require.Equal(t, "agent", out.Intent.CreatedBy)
		require.Equal(t, 1, b.count(t, `idempotency_key = 'http-1' AND created_by = 'agent'`))

		// Each session acts as its own token.
		mailer := connect(mailSecret)
		require.Contains(t, toolErr(t, call(t, mailer, mcpserver.ToolGet, map[string]any{"key": "http-1"})), "not found")
		require.Contains(t, toolErr(t, call(t, mailer, mcpserver.ToolPropose, map[string]any{
			"connector": "webhook", "key": "http-2", "payload": map[string]any{},
		})), "forbidden")
		require.Equal(t, 0, b.count(t, `idempotency_key = 'http-2'`))
	})
}

func TestReplayComparesNumbersAndPurgedPayloads(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	prop := func(key, payload string) map[string]any {
		return map[string]any{"connector": "webhook", "key": key, "payload": json.RawMessage(payload)}
	}
	first := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, prop("n", `{"a":1.0,"big":12345678901234567890}`)))
	require.True(t, first.Inserted)
	again := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, prop("n", `{"big":12345678901234567890.0,"a":1}`)))
	require.True(t, again.Replayed)
	toolErr(t, call(t, cs, mcpserver.ToolPropose, prop("n", `{"a":1,"big":12345678901234567891}`)))

	// Payment (approval-gated), replayed after approval-wait.
	pay := map[string]any{"connector": "payment", "key": "pay", "payload": json.RawMessage(`{"operation":"payment_intent.create","params":{"amount":100,"currency":"eur"}}`)}
	p1 := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, pay))
	require.Equal(t, "awaiting_approval", p1.Intent.Status)
	p2 := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, pay))
	require.True(t, p2.Replayed)

	// A purged row: {} is not the same decision.
	ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, prop("pw", `{"email":"a@example.com"}`)))
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status='delivered', payload='{}' WHERE idempotency_key='pw'`)
	require.NoError(t, err)
	r := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, prop("pw", `{"email":"a@example.com"}`)))
	require.True(t, r.Replayed)
	toolErr(t, call(t, cs, mcpserver.ToolPropose, prop("pw", `{}`)))
}

// outageCalls are a call of each tool that reads or writes the database, by tool name,
// for the tests of a database that is out of reach.
func outageCalls() map[string]map[string]any {
	return map[string]map[string]any{
		mcpserver.ToolPropose: {"connector": "webhook", "key": "k-1", "payload": map[string]any{}},
		mcpserver.ToolGet:     {"key": "k-1"},
		mcpserver.ToolList:    {},
	}
}

// A database that accepts connections but never answers (a hung server, a stalled
// network path) must give the agent a tool error within Config.CallTimeout, not a call
// that never returns: pgx has no deadline of its own without connect_timeout.
func TestMCPDatabaseNotAnswering(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://app:hunter2@"+pgtest.UnansweringAddr(t)+"/app")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	svc := &intent.Service{Pool: pool, Policy: testPolicy()}
	cs := connectAs(t, svc, &svc.Policy.Tokens[0], &mcpserver.Config{CallTimeout: 100 * time.Millisecond})

	for tool, args := range outageCalls() {
		// The bound is the test's, far above CallTimeout: without one the call would
		// wait for ever.
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		cancel()
		require.NoError(t, err, tool)
		msg := toolErr(t, res)
		require.Contains(t, msg, "did not answer", tool)
		require.NotContains(t, msg, "hunter2", tool)
	}
}

// A database that refuses connections is a tool error that says so, without the
// connection's details, not a bare "internal error".
func TestMCPDatabaseDown(t *testing.T) {
	t.Parallel()
	addr := pgtest.UnreachableAddr(t)
	pool, err := pgxpool.New(t.Context(), "postgres://app:hunter2@"+addr+"/app")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, svc: &intent.Service{Pool: pool, Policy: testPolicy()}}
	cs := b.connect(t, "agent")
	for tool, args := range outageCalls() {
		msg := toolErr(t, call(t, cs, tool, args))
		require.Contains(t, msg, "database is unavailable", tool)
		require.NotContains(t, msg, "hunter2", tool)
		require.NotContains(t, msg, addr, tool)
	}
}

// A database that does not answer the connection's start within the pool's own
// connect_timeout (outboxd mcp gives each connection 10s, inside CallTimeout's 20s) is
// the same tool error as one that refuses: it says the database is unavailable and that
// calling again is safe, without the connection's details.
func TestMCPDatabaseConnectTimeout(t *testing.T) {
	t.Parallel()
	addr := pgtest.UnansweringAddr(t)
	cfg, err := pgxpool.ParseConfig("postgres://app:hunter2@" + addr + "/app")
	require.NoError(t, err)
	cfg.ConnConfig.ConnectTimeout = 100 * time.Millisecond
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, svc: &intent.Service{Pool: pool, Policy: testPolicy()}}
	cs := b.connect(t, "agent")
	for tool, args := range outageCalls() {
		msg := toolErr(t, call(t, cs, tool, args))
		require.Contains(t, msg, "database is unavailable", tool)
		require.NotContains(t, msg, addr, tool)
		require.NotContains(t, msg, "user=app", tool)
	}
}

// A database that ends the session a call took (a restart, a failover: SQLSTATE 57P01)
// is the same tool error as one that is down, not an "internal error".
func TestMCPDatabaseEndedSession(t *testing.T) {
	t.Parallel()
	admin := pgtest.DB(t)
	// The call takes the ended session as it is, as in a busy pool.
	pool := pgtest.OneSessionPool(t, admin)
	b := &testBundle{pool: pool, svc: &intent.Service{Pool: pool, Policy: testPolicy()}}
	cs := b.connect(t, "agent")
	for tool, args := range outageCalls() {
		pgtest.EndSession(t, admin, pool)

		msg := toolErr(t, call(t, cs, tool, args))
		require.Contains(t, msg, "database is unavailable", tool)
	}
}

// A database that takes no writes (a hot standby reached after a failover, a demoted
// primary: SQLSTATE 25006) is the same tool error as one that is down, which tells the
// agent to call again later, not an "internal error".
func TestMCPDatabaseReadOnly(t *testing.T) {
	t.Parallel()
	cfg := pgtest.DB(t).Config().Copy()
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, svc: &intent.Service{Pool: pool, Policy: testPolicy()}}
	cs := b.connect(t, "agent")
	msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{"connector": "webhook", "key": "k-1", "payload": map[string]any{}}))
	require.Contains(t, msg, `database is unavailable; calling again later with the same key "k-1" is safe`)
}

// A failover that leaves the old primary up but taking no writes, while new sessions
// reach the new primary (target_session_attrs=read-write, a DNS name that moved): the
// pool's session on the old server answers pings, so pgxpool keeps it until its
// MaxConnLifetime (an hour by default). The agent is told calling again later is safe,
// and a call made once the new primary takes writes must then work.
func TestMCPLeavesSessionsThatTakeNoWrites(t *testing.T) {
	t.Parallel()
	var failedOver atomic.Bool
	cfg := pgtest.DB(t).Config().Copy()
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if !failedOver.Load() {
			_, err := c.Exec(ctx, `SET default_transaction_read_only = on`)
			return err
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, svc: &intent.Service{Pool: pool, Policy: testPolicy()}}
	cs := b.connect(t, "agent")
	args := map[string]any{"connector": "webhook", "key": "k-1", "payload": map[string]any{}}
	require.Contains(t, toolErr(t, call(t, cs, mcpserver.ToolPropose, args)), "database is unavailable")

	failedOver.Store(true)
	res := call(t, cs, mcpserver.ToolPropose, args)
	require.False(t, res.IsError, text(res))
}
