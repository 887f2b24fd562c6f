package mcpserver_test

import (
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
