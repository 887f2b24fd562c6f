package mcpserver_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/mcpserver"
)

// A transaction PostgreSQL ends to resolve a conflict with concurrent work (a
// serialization failure, 40001, or a deadlock, 40P01) is no fault of the call, and the
// same call again may well succeed: the intent API answers 503 for it. MCP answered the
// generic "internal error", which reads as a fault of outboxd's. Here the database
// raises each in a trigger on every insert of key k, after the outbox's own retries too.
func TestContendedDatabaseIsRetryableForTheAgent(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"serialization_failure", "deadlock_detected"} {
		t.Run(code, func(t *testing.T) {
			t.Parallel()
			b := setupService(t)
			_, err := b.pool.Exec(t.Context(), `
CREATE FUNCTION contend() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'concurrent work' USING ERRCODE = '`+code+`';
END $$;
CREATE TRIGGER contend BEFORE INSERT ON outbox FOR EACH ROW
    WHEN (NEW.idempotency_key = 'k') EXECUTE FUNCTION contend()`)
			require.NoError(t, err)
			cs := b.connect(t, "agent")
			args := map[string]any{"connector": "webhook", "key": "k", "payload": map[string]any{"n": 1}}

			msg := toolErr(t, call(t, cs, mcpserver.ToolPropose, args))
			require.Contains(t, msg, "conflict with concurrent work", msg)
			require.Contains(t, msg, `calling again with the same key "k" is safe`)
			require.NotContains(t, msg, "internal error")

			_, err = b.pool.Exec(t.Context(), `DROP TRIGGER contend ON outbox`)
			require.NoError(t, err)
			out := ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, args))
			require.True(t, out.Inserted)
		})
	}
}
