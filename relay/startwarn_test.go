package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestStartWarnsWhileTheDatabaseIsUnreachable: at start the relay tries the database for
// up to 30 seconds. It said nothing meanwhile, so a relay given a wrong password or host,
// or started before its database, showed "http server listening" and then no line for
// 30 seconds before it gave up. It now warns once, at the first failure, with the
// database's error.
func TestStartWarnsWhileTheDatabaseIsUnreachable(t *testing.T) {
	t.Parallel()

	// Nothing listens on port 1: every connection is refused at once.
	pool, err := pgxpool.New(t.Context(), "postgres://app@127.0.0.1:1/app?connect_timeout=5")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var logs logBuffer
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "cannot reach the database at start; trying again for up to 30 seconds")
	}, 20*time.Second, 10*time.Millisecond, "no warning while the start waits for the database; logs:\n%s", logs.String())
	require.Contains(t, logs.String(), "connection refused", "the warning carries the database's error")
	require.Equal(t, 1, strings.Count(logs.String(), "cannot reach the database"), "one warning, not one a try")

	cancel()
	require.NoError(t, <-done, "a stop while waiting for the database is no failure")
}
