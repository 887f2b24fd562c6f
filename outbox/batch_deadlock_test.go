package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A batch in a transaction of EnqueueBatch's own (on a pool, a DB that wraps one, or a
// connection outside a transaction) that PostgreSQL aborts as a deadlock's victim
// (40P01) is retried, as a serialization failure is: nothing of it was written. Batches
// take their keys in key order, so two of them never deadlock (TestBatchesOppositeOrders),
// but a caller's transaction that enqueues one key and then another (two batches, or
// Enqueue then a batch, or plain SQL) takes them in its own order. Here the caller's
// transaction holds "k3" and then asks for "k1", which the batch [k3, k1, k2] holds while
// it waits on "k3": the batch, which waits last and checks for a deadlock after 10ms
// (the caller's session after a minute), is the victim. A third transaction holding "k2"
// lines them up, and a fourth, queued for a lock on the table that the batch's inserts
// then wait behind, holds the batch's second try back until the caller's transaction has
// taken "k1" (else the two could deadlock again, the caller's as the victim).
func TestOwnBatchRetriesDeadlock(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"pool", "wrapped", "conn"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.DB(t)
			cfg := pool.Config().Copy()
			cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "10ms"
			cfg.MaxConns = 1 // its one session is the one that waits
			quick, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(quick.Close)
			conn, err := quick.Acquire(ctx)
			require.NoError(t, err)
			pid := int(conn.Conn().PgConn().PID())
			var db outbox.DB = conn.Conn()
			if via != "conn" {
				conn.Release()
				db = quick
				if via == "wrapped" {
					db = wrapDB{quick}
				}
			} else {
				defer conn.Release()
			}

			begin := func() (pgx.Tx, int) {
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				t.Cleanup(func() { tx.Rollback(context.WithoutCancel(ctx)) }) //nolint:errcheck // cleanup
				_, err = tx.Exec(ctx, `SET LOCAL deadlock_timeout = '1min'`)
				require.NoError(t, err)
				var pid int
				require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
				return tx, pid
			}
			lineup, _ := begin()
			_, err = outbox.Enqueue(ctx, lineup, webhookMsg("k2", []int{2}))
			require.NoError(t, err)
			mine, minePid := begin()
			_, err = outbox.EnqueueBatch(ctx, mine, []outbox.Message{webhookMsg("k3", []int{3})})
			require.NoError(t, err)

			type result struct {
				out []outbox.Intent
				err error
			}
			ownDone, mineDone := make(chan result, 1), make(chan result, 1)
			go func() {
				out, err := outbox.EnqueueBatch(ctx, db, []outbox.Message{
					webhookMsg("k3", []int{3}), webhookMsg("k1", []int{1}), webhookMsg("k2", []int{2}),
				})
				ownDone <- result{out, err}
			}()
			waitBlocked(t, pool, pid) // holds k1, waits on k2
			go func() {
				out, err := outbox.EnqueueBatch(ctx, mine, []outbox.Message{webhookMsg("k1", []int{1})})
				mineDone <- result{out, err}
			}()
			waitBlocked(t, pool, minePid) // holds k3, waits on k1
			gate, gatePid := begin()
			gateDone := make(chan error, 1)
			go func() {
				_, err := gate.Exec(ctx, `LOCK TABLE outbox IN SHARE ROW EXCLUSIVE MODE`)
				gateDone <- err
			}()
			waitBlocked(t, pool, gatePid)
			require.NoError(t, lineup.Rollback(ctx))

			r := <-mineDone
			require.NoError(t, r.err, "the caller's transaction is not the victim")
			require.True(t, r.out[0].Inserted)
			require.NoError(t, mine.Commit(ctx))
			require.NoError(t, <-gateDone)
			require.NoError(t, gate.Rollback(ctx))

			r = <-ownDone
			require.NoError(t, r.err, "the batch's own transaction is retried after the deadlock")
			require.Len(t, r.out, 3)
			require.False(t, r.out[0].Inserted, "k3 is the caller's")
			require.False(t, r.out[1].Inserted, "k1 is the caller's")
			require.True(t, r.out[2].Inserted, "k2 is the batch's")
			require.Equal(t, 3, countRows(t, pool))
		})
	}
}
