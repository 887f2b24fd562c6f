package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Cancelling or rejecting the head of an ordering key lets the key's next row go, and
// that row may lie behind where a relay's claims start (it waited for its head): like
// approve and replay, cancel and reject wake relays with a NOTIFY, which makes their next
// claims start at the head of the index, instead of leaving the row until the next
// periodic claim from there.
func TestCancelAndRejectWakeRelays(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `LISTEN outbox`)
	require.NoError(t, err)
	// As if a relay polled fast: the inserts below send no NOTIFY of their own.
	_, err = pool.Exec(ctx, `INSERT INTO outbox_wake_connectors (connector, relay_id, polling_until) VALUES ('webhook', 'r', 'infinity')`)
	require.NoError(t, err)
	for _, m := range []outbox.Message{
		{Key: "head", Connector: "webhook", OrderingKey: "k", Payload: []int{1}},
		{Key: "gated", Connector: "webhook", OrderingKey: "g", Payload: []int{1}, RequireApproval: true},
	} {
		_, err := outbox.Enqueue(ctx, pool, m)
		require.NoError(t, err)
	}
	expect := func(what string) {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := conn.Conn().WaitForNotification(c)
		require.NoError(t, err, "%s sent no NOTIFY", what)
	}
	res, err := ops.Cancel(ctx, pool, []string{"head"}, "alice", "not needed", time.Time{})
	require.NoError(t, err)
	require.Equal(t, []string{"head"}, res.Canceled)
	expect("cancel")
	_, err = ops.Reject(ctx, pool, "gated", "alice", "no", time.Time{})
	require.NoError(t, err)
	expect("reject")
}
