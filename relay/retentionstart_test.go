package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// Retention's first pass came a minute after start, so a relay restarted more often
// than that (a crash loop, a short-lived job that embeds it) never deleted a row past
// retention, however many there were. It comes once the relay's first periodic work is
// done; the relay is ready and delivers meanwhile. Here later passes would come only
// after an hour: the first pass alone deletes the rows.
func TestRetentionRunsSoonAfterStart(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	enqueue(t, b.pool, "old", "webhook", []int{1})
	enqueue(t, b.pool, "old-canceled", "webhook", []int{2})
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = CASE WHEN idempotency_key = 'old' THEN 'delivered' ELSE 'canceled' END,
		updated_at = now() - interval '8 days'`)
	require.NoError(t, err)
	enqueue(t, b.pool, "new", "webhook", []int{3})

	r := b.newRelay(t, b.fastConfig())
	r.retentionEvery = time.Hour
	run(t, r)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	waitStatus(t, b.pool, "new", outbox.StatusDelivered)
	require.Eventually(t, func() bool {
		// No require here: the condition runs in a goroutine of Eventually's, where
		// FailNow may not be called.
		var n int
		err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE idempotency_key LIKE 'old%'`).Scan(&n)
		return err == nil && n == 0
	}, waitTimeout, 10*time.Millisecond, "the rows past retention are deleted soon after start")
}
