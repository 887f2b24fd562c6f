package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Enqueue and EnqueueBatch on a pool, where the server's default isolation is REPEATABLE
// READ or SERIALIZABLE (ALTER DATABASE ... SET default_transaction_isolation): the
// caller holds no transaction it could retry, so a key another transaction commits while
// the enqueue waits on it must give what it gives under READ COMMITTED, the existing
// intent or ErrKeyConflict, not a serialization failure (the intent API answered a
// concurrent retry of a request 500). EnqueueBatch begins its own transaction through a
// DB of the caller's that wraps the pool too, so it retries there as well.
func TestPoolEnqueueUnderStricterDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		for _, batch := range []string{"", "pool", "wrapped"} {
			for _, same := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/batch=%s/same=%v", level, batch, same), func(t *testing.T) {
					t.Parallel()
					ctx := t.Context()
					pool := pgtest.DB(t)
					cfg := pool.Config().Copy()
					cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
					cfg.MaxConns = 1 // its one session is the one that waits
					strict, err := pgxpool.NewWithConfig(ctx, cfg)
					require.NoError(t, err)
					t.Cleanup(strict.Close)
					var pid int
					require.NoError(t, strict.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))

					other, err := pool.Begin(ctx)
					require.NoError(t, err)
					defer other.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
					first, err := outbox.Enqueue(ctx, other, webhookMsg("k", []int{1}))
					require.NoError(t, err)

					m := webhookMsg("k", []int{1})
					if !same {
						m = webhookMsg("k", []int{2})
					}
					type result struct {
						in  outbox.Intent
						err error
					}
					done := make(chan result, 1)
					go func() {
						if batch != "" {
							var db outbox.DB = strict
							if batch == "wrapped" {
								db = wrapDB{strict}
							}
							out, err := outbox.EnqueueBatch(ctx, db, []outbox.Message{webhookMsg("fresh", []int{1}), m})
							if err != nil {
								done <- result{err: err}
								return
							}
							done <- result{in: out[1]}
							return
						}
						in, err := outbox.Enqueue(ctx, strict, m)
						done <- result{in, err}
					}()
					waitBlocked(t, pool, pid)
					require.NoError(t, other.Commit(ctx))

					r := <-done
					if !same {
						require.ErrorIs(t, r.err, outbox.ErrKeyConflict)
						require.Equal(t, 1, countRows(t, pool), "nothing of the batch is written")
						return
					}
					require.NoError(t, r.err)
					require.False(t, r.in.Inserted)
					require.Equal(t, first.ID, r.in.ID)
				})
			}
		}
	}
}
