package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// cancelingTx cancels the batch's context once its insert has returned, before its
// next statement is sent: a client that goes away at that moment.
type cancelingTx struct {
	pgx.Tx
	cancel  context.CancelFunc
	queries int
}

func (c *cancelingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.queries++
	if c.queries == 2 {
		c.cancel()
	}
	return c.Tx.Query(ctx, sql, args...)
}

// A batch that fails because its context ended must still leave none of its rows in the
// caller's transaction, which is healthy (nothing was sent) and may commit its own work
// under another context, as pgx.BeginFunc(context.Background(), ...) around a request's
// statements does.
func TestBatchCanceledLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := outbox.Enqueue(ctx, pool, webhookMsg("taken", []int{1}))
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
	batchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err = outbox.EnqueueBatch(batchCtx, &cancelingTx{Tx: tx, cancel: cancel},
		[]outbox.Message{webhookMsg("new", []int{1}), webhookMsg("taken", []int{2})})
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, tx.Commit(ctx))

	_, err = outbox.Get(ctx, pool, "new")
	require.ErrorIs(t, err, outbox.ErrNotFound, "the failed batch's row was committed with the caller's work")
}
