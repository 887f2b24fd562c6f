package outbox_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Enqueue, EnqueueBatch and Get work on a pool in every query exec mode: the simple
// protocol (a transaction pooler's usual setting) sends a [][]byte or []byte argument as
// bytea text, which PostgreSQL refuses as jsonb.
func TestEnqueueInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.InMode(t, pgtest.DB(t), mode)
			m := outbox.Message{Key: "one", Connector: "webhook", Payload: json.RawMessage(`{"a":1}`),
				Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
			in, err := outbox.Enqueue(t.Context(), pool, m)
			require.NoError(t, err)
			require.True(t, in.Inserted)
			again, err := outbox.Enqueue(t.Context(), pool, m)
			require.NoError(t, err)
			require.False(t, again.Inserted)
			got, err := outbox.EnqueueBatch(t.Context(), pool, []outbox.Message{
				m, {Key: "two", Connector: "webhook", Payload: json.RawMessage(`[2]`)}})
			require.NoError(t, err)
			require.Len(t, got, 2)
			two, err := outbox.Get(t.Context(), pool, "two")
			require.NoError(t, err)
			require.JSONEq(t, `[2]`, string(two.Payload))
		})
	}
}
