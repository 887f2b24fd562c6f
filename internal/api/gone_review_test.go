package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A request whose client goes away (or that shutdown cuts off) while its transaction
// waits ends with its context cancelled: nothing is written, and that is no error of
// the server's. It was logged at ERROR as `intent api err="enqueue \"k\": context
// canceled"`, once for every client that hung up.
func TestClientGoneIsNotAnError(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})

	// Hold inserts until the request is waiting on the lock.
	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(t.Context())) //nolint:errcheck // released below
	_, err = tx.Exec(t.Context(), `LOCK TABLE outbox IN SHARE MODE`)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", b.url+"/v1/intents",
		strings.NewReader(`{"connector":"webhook","payload":{}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminSecret)
	req.Header.Set("Idempotency-Key", "gone")
	failed := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = res.Body.Close()
		}
		failed <- err
	}()
	require.Eventually(t, func() bool {
		var waiting int
		err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting)
		return err == nil && waiting > 0
	}, 10*time.Second, 10*time.Millisecond, "the request never waited on the lock")
	cancel()
	require.Error(t, <-failed)
	require.Eventually(t, func() bool { return strings.Contains(b.logs.String(), `"msg":"intent api request"`) },
		10*time.Second, 10*time.Millisecond, "the request never finished")
	require.NoError(t, tx.Rollback(t.Context()))

	require.NotContains(t, b.logs.String(), `"level":"ERROR"`)
	require.Contains(t, b.logs.String(), "before it finished")
	require.Zero(t, b.count(t))
}
