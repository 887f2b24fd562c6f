package relay

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// outboxd_oldest_due_wait_seconds is "the gauge to alert on for a relay that does not
// keep up", read "as outboxd status's oldest_due_wait". A due row that waits for an
// earlier row of its ordering key (one waiting out its retry's backoff) waits for that
// row, not for a relay: status leaves it out (TestStatusRowsWaitingForTheirOrderingKeyAreNoBacklog),
// and the relay parks such rows (parkSQL) only when it writes the head's failure, so a
// row enqueued behind the head after that stays due until the head's next retry, up to
// OUTBOX_BACKOFF_MAX (an hour). The gauge counted it, so an alert on it fired for the
// whole backoff while status said healthy.
func TestOldestDueWaitLeavesOutRowsWaitingForTheirKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	_, err := pool.Exec(t.Context(), `
		INSERT INTO outbox (idempotency_key, connector, payload, ordering_key, attempts, first_attempt_at, last_error, created_at, next_attempt_at)
		VALUES ('head', 'webhook', '{}', 'k', 3, $1::timestamptz - interval '40 minutes', 'attempt 3: 503',
		        $1::timestamptz - interval '40 minutes', $1::timestamptz + interval '40 minutes'),
		       ('behind', 'webhook', '{}', 'k', 0, NULL, NULL,
		        $1::timestamptz - interval '20 minutes', $1::timestamptz - interval '20 minutes')`, t0)
	require.NoError(t, err)

	rep, err := ops.Status(t.Context(), pool, t0)
	require.NoError(t, err)
	require.Len(t, rep.Connectors, 1)
	require.Zero(t, rep.Connectors[0].OldestDueWait, "status: the row waits for its key's head, not for a relay")
	require.Equal(t, ops.VerdictHealthy, rep.Verdict)

	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), NowFunc: func() time.Time { return t0 }, Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.Equal(t, 2400.0, testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook")))
	require.Zero(t, testutil.ToFloat64(r.metrics.oldestDueWait.WithLabelValues("webhook")),
		"the metric agrees with status: no row waits for a relay")
}
