package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	var mayCreate bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&mayCreate))
	if !mayCreate {
		t.Skip("the test database's role may not create roles")
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	plain, app := "outboxd_insert_"+hex.EncodeToString(suffix), "outboxd_app_"+hex.EncodeToString(suffix)
	pid, aid := pgx.Identifier{plain}.Sanitize(), pgx.Identifier{app}.Sanitize()
	for _, stmt := range []string{
		`CREATE ROLE ` + pid + ` LOGIN`,
		`CREATE ROLE ` + aid + ` LOGIN`,
		`GRANT USAGE ON SCHEMA public TO ` + pid + `, ` + aid,
		`GRANT INSERT ON outbox TO ` + pid,
		`GRANT SELECT, INSERT, DELETE ON outbox TO ` + aid,
		`GRANT USAGE ON SEQUENCE outbox_id_seq TO ` + aid,
		`GRANT SELECT, DELETE ON outbox_attempts TO ` + aid,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, err := pool.Exec(ctx, `DROP OWNED BY `+pid+`, `+aid)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `DROP ROLE `+pid+`, `+aid)
		require.NoError(t, err)
	})
	as := func(role string) *pgxpool.Pool {
		pcfg := pool.Config().Copy()
		pcfg.ConnConfig.User = role
		p, err := pgxpool.NewWithConfig(ctx, pcfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	plainPool, appPool := as(plain), as(app)

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
