package outbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// An application's role with only the grants the README lists: plain INSERT needs
// INSERT on outbox; Enqueue and Get SELECT on it too; EnqueueBatch USAGE on
// outbox_id_seq, and for its undo DELETE on outbox and SELECT, DELETE on
// outbox_attempts.
func TestApplicationWorksWithTheREADMEsPrivileges(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := t.Context()
	plainPool := pgtest.PoolAs(t, pool, pgtest.Role(t, pool, "outboxd_insert_", `GRANT INSERT ON outbox TO ROLE_`))
	appPool := pgtest.PoolAs(t, pool, pgtest.Role(t, pool, "outboxd_app_",
		`GRANT SELECT, INSERT, DELETE ON outbox TO ROLE_`,
		`GRANT USAGE ON SEQUENCE outbox_id_seq TO ROLE_`,
		`GRANT SELECT, DELETE ON outbox_attempts TO ROLE_`))

	_, err := plainPool.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('plain', 'webhook', '{}')`)
	require.NoError(t, err)

	in, err := outbox.Enqueue(ctx, appPool, webhookMsg("one", []int{1}))
	require.NoError(t, err)
	require.True(t, in.Inserted)
	again, err := outbox.Enqueue(ctx, appPool, webhookMsg("one", []int{1}))
	require.NoError(t, err)
	require.False(t, again.Inserted)
	require.Equal(t, in.ID, again.ID)
	_, err = outbox.Enqueue(ctx, appPool, webhookMsg("one", []int{2}))
	require.ErrorIs(t, err, outbox.ErrKeyConflict)
	got, err := outbox.Get(ctx, appPool, "one")
	require.NoError(t, err)
	require.Equal(t, in.ID, got.ID)
	_, err = outbox.Get(ctx, appPool, "none")
	require.ErrorIs(t, err, outbox.ErrNotFound)

	out, err := outbox.EnqueueBatch(ctx, appPool, []outbox.Message{webhookMsg("b1", []int{1}), webhookMsg("one", []int{1})})
	require.NoError(t, err)
	require.True(t, out[0].Inserted)
	require.False(t, out[1].Inserted)

	// A batch with new keys and a key used for a different request is undone.
	err = pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{webhookMsg("b2", []int{1}), webhookMsg("one", []int{2})})
		require.ErrorIs(t, err, outbox.ErrKeyConflict)
		_, err = outbox.Enqueue(ctx, tx, webhookMsg("b3", []int{1}))
		return err
	})
	require.NoError(t, err, "the caller's transaction is still usable")
	_, err = outbox.Get(ctx, pool, "b2")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = outbox.Get(ctx, pool, "b3")
	require.NoError(t, err)
}
