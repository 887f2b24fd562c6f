package mcpserver_test

import (
	"encoding/json"
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

// propose_intent's reason goes to the server's log and back in the result; nothing
// stores it with the intent, so the people who review the intent (get_intent, the API,
// outboxd inspect and approve) never see it. The tool must not tell the agent they do.
func TestProposeReasonIsDescribedAsItIsKept(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	const reason = "reason-7f3a: the customer asked for a refund"
	out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "payment", "key": "pay-1", "reason": reason,
		"payload": map[string]any{"operation": "payment_intent.create", "params": map[string]any{"amount": 100, "currency": "eur"}},
	}))
	require.Equal(t, "awaiting_approval", out.Intent.Status)
	// What a reviewer can read holds no reason.
	require.Equal(t, 0, b.count(t, `strpos(outbox::text, 'reason-7f3a') > 0`))
	var audits int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_audit`).Scan(&audits))
	require.Zero(t, audits)

	tools, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	for _, tool := range tools.Tools {
		if tool.Name != mcpserver.ToolPropose {
			continue
		}
		require.NotContains(t, tool.Description, "for the people who review")
		require.Contains(t, tool.Description, "not stored with the intent")
		schema, err := json.Marshal(tool.InputSchema)
		require.NoError(t, err)
		require.NotContains(t, string(schema), "a person reviewing it understands")
	}
}

// A key the connector cannot send (it travels as a header: control characters, white
// space at either end; Stripe's limit is 255 bytes) is refused by the outbox whatever the
// rest of the request: the tool error must ask for another key, not for the same one.
func TestProposeUnsendableKeyAsksForAnotherKey(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	payment := map[string]any{"operation": "payment_intent.create", "params": map[string]any{"amount": 100, "currency": "eur"}}
	for _, tc := range []struct {
		connector, key string
		payload        map[string]any
	}{
		{"webhook", " order-1", map[string]any{}},
		{"webhook", "order-1 ", map[string]any{}},
		{"webhook", "order\n1", map[string]any{}},
		{"payment", strings.Repeat("é", 200), payment}, // 200 characters, 400 bytes
	} {
		msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
			"connector": tc.connector, "key": tc.key, "payload": tc.payload,
		}))
		require.NotContains(t, msg, "same key", "%q: %s", tc.key, msg)
		require.Contains(t, msg, "key_parts", "%q", tc.key)
		require.Contains(t, msg, "nothing was written", "%q", tc.key)
	}
	// A connector that is none is what the error names, not the key.
	msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{"connector": "fax", "key": " order-1", "payload": map[string]any{}}))
	require.Contains(t, msg, `connector "fax"`)
	require.NotContains(t, msg, "cannot be sent")
	// Slack carries the key in message metadata, not a header: such a key is its to use.
	out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "slack", "key": " order-1", "payload": map[string]any{"channel": "C0123456789", "text": "hi"},
	}))
	require.True(t, out.Inserted)
	require.Equal(t, 1, b.count(t, `true`))
}

// Such a key written before the rule that refuses it (by an older outboxd, or by plain
// SQL) names its intent all the same: the outbox answers the same request under it with
// that intent, its stored outcome, as the intent API does. propose_intent refused it
// before asking, saying nothing was written and to pass key_parts, so an agent that
// retried a performed effect derived a new key and had it performed again.
func TestProposeUnsendableKeyWrittenBeforeIsTheIntent(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	_, err := b.pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, delivered_at, attempts)
VALUES (' order-1', 'webhook', '{"n": 1}', 'delivered', now(), 1)`)
	require.NoError(t, err)
	cs := b.connect(t, "agent")

	out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "webhook", "key": " order-1", "payload": map[string]any{"n": 1},
	}))
	require.True(t, out.Replayed)
	require.Equal(t, "delivered", out.Intent.Status)
	require.Equal(t, 1, b.count(t, `true`))

	// A key no intent holds is refused as before, asking for another.
	msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "webhook", "key": " order-2", "payload": map[string]any{"n": 1},
	}))
	require.Contains(t, msg, "key_parts")
	require.Equal(t, 1, b.count(t, `true`))
}
