package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A batch undone for a conflict leaves its key free for a concurrent
// enqueue of another request, which waited on it.
func TestBatchUndoFreesKeyForWaiter(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := outbox.Enqueue(ctx, pool, webhookMsg("b", []int{1}))
	require.NoError(t, err)

	t1, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer t1.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
	_, err = outbox.EnqueueBatch(ctx, t1, []outbox.Message{webhookMsg("a", []int{1}), webhookMsg("b", []int{2})})
	require.ErrorIs(t, err, outbox.ErrKeyConflict)

	t2, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer t2.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
	var pid int
	require.NoError(t, t2.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	done := make(chan error, 1)
	var in outbox.Intent
	go func() {
		var err error
		in, err = outbox.Enqueue(ctx, t2, webhookMsg("a", []int{9}))
		done <- err
	}()
	waitBlocked(t, pool, pid)
	require.NoError(t, t1.Commit(ctx))
	require.NoError(t, <-done)
	require.True(t, in.Inserted)
	require.NoError(t, t2.Commit(ctx))
	got, err := outbox.Get(ctx, pool, "a")
	require.NoError(t, err)
	require.JSONEq(t, `[9]`, string(got.Payload))
}
