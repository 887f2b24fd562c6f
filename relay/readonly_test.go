package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
)

// readOnlyPool is a pool on b's database whose sessions take no writes, as those of a
// hot standby or of a primary set default_transaction_read_only do (SQLSTATE 25006).
func readOnlyPool(t *testing.T, b *testBundle) *pgxpool.Pool {
	t.Helper()
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// A relay started on a database that takes no writes (a hot standby, a primary
// demoted, default_transaction_read_only) can claim nothing and record nothing: Run
// fails at once saying so, rather than starting, saying it is ready, and failing every
// claim with a warning for as long as it runs.
func TestRunFailsAtOnceOnAReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r, err := New(readOnlyPool(t, b), cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	// Well inside the relay's wait for a database that is not up (30 s).
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorContains(t, err, "takes no writes")
}
