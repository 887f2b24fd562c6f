package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// EnqueueBatch on a connection (a DB that is no pgx.Tx) whose session is inside a
// transaction begun with SQL: the batch is part of that transaction, as Enqueue's row
// is. Its own BEGIN and COMMIT committed the caller's transaction, whose later ROLLBACK
// then removed nothing; a conflict's ROLLBACK rolled back the caller's earlier work.
// The same through a DB of the caller's that wraps the connection, which the package
// cannot see into.
func TestBatchOnConnectionInSQLTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := outbox.Enqueue(ctx, pool, webhookMsg("taken", []int{1}))
	require.NoError(t, err)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for name, db := range map[string]outbox.DB{
		"pgxpool.Conn": conn, "pgx.Conn": conn.Conn(),
		"wrapped pgxpool.Conn": wrapDB{conn}, "wrapped pgx.Conn": wrapDB{conn.Conn()},
	} {
		_, err = conn.Exec(ctx, `BEGIN`)
		require.NoError(t, err)
		_, err = outbox.Enqueue(ctx, db, webhookMsg("mine", []int{1}))
		require.NoError(t, err)

		_, err = outbox.EnqueueBatch(ctx, db, []outbox.Message{webhookMsg("new", []int{1}), webhookMsg("taken", []int{2})})
		require.ErrorIs(t, err, outbox.ErrKeyConflict, name)
		require.Equal(t, 2, countRows(t, db), "%s: the caller's transaction keeps its work, without the batch's", name)

		_, err = outbox.EnqueueBatch(ctx, db, []outbox.Message{webhookMsg("new", []int{1})})
		require.NoError(t, err, name)
		_, err = conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`)
		require.NoError(t, err)
		require.Equal(t, 1, countRows(t, pool), "%s: the caller's rollback removes the batch and its own work", name)
	}
}
