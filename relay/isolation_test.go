package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
)

// A relay whose sessions run at REPEATABLE READ or SERIALIZABLE by default (ALTER
// DATABASE ... SET default_transaction_isolation, or an application's pool that sets it)
// started and claimed as though its statements each took a snapshot of their own, as
// under READ COMMITTED: a claim round that waited for an operator's replay of the dead
// head of an ordering key (internal/replaylock) had taken its snapshot before the wait,
// at its transaction's first statement, so it read the head as still dead and claimed
// the key's next row, and the next round claimed the replayed head: two rows of the key
// in flight, out of order. Run now fails at once, saying so and what to set.
func TestRunFailsAtOnceWhenSessionsAreNotReadCommitted(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			_, cfg := b.clockedConfig(t)
			pcfg := b.pool.Config().Copy()
			pcfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
			require.NoError(t, err)
			// Well inside the relay's wait for a database that is not up (30 s).
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			err = r.Run(ctx)
			require.ErrorContains(t, err, "isolation level "+level)
			require.ErrorContains(t, err, "default_transaction_isolation=read%20committed")
		})
	}
}
