package relay

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
)

// A Retry-After that names no wait (0, or a date already past: the receiver's clock a
// little behind the relay's is enough) used to schedule the retry at once, so a row was
// claimed again as soon as its outcome landed, and a receiver answering 503 with it for a
// moment used up every attempt within milliseconds and sent the row to dead. Such a row
// waits for its backoff, as without the header.
func TestRetryAfterOfNoWaitBacksOff(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.BackoffBase, cfg.BackoffMax = 10*time.Second, time.Hour
	hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Enforced, NowFunc: clock.Now})
	require.NoError(t, err)
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: hook}})
	require.NoError(t, err)
	inst := r.instances["webhook"]

	for key, retryAfter := range map[string]string{
		"zero": "0",
		"past": clock.Now().Add(-time.Minute).UTC().Format(http.TimeFormat),
	} {
		b.receiver.Plan(key, receiver.Plan{FailFirst: 100, RetryAfter: retryAfter, Date: clock.Now().UTC().Format(http.TimeFormat)})
		enqueue(t, b.pool, key, "webhook", []string{key})
	}
	rows := claimRows(t, r, "webhook")
	require.Len(t, rows, 2)
	for _, row := range rows {
		r.deliver(t.Context(), inst, row)
		o := <-r.results
		require.Equal(t, statusPending, o.status, "%s: %s", row.key, *o.lastError)
		require.NotNil(t, o.nextAt)
		require.GreaterOrEqual(t, o.nextAt.Sub(clock.Now()), 8*time.Second,
			"%s: retried after the backoff (10s ±20%%), not at once: %s", row.key, *o.lastError)
	}
}

// last_error says when the receiver set the time of the next attempt. It used to read
// "retrying at <a time ten days away>", or "gave up: the next attempt at <that time>
// would be later than the maximum age", with nothing to tell the person reading it that
// the receiver's Retry-After, not the relay's backoff, had asked for that wait.
func TestLastErrorNamesTheReceiversRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	cfg.MaxAge = 72 * time.Hour
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	inst := r.instances["webhook"]

	b.receiver.Plan("soon", receiver.Plan{FailFirst: 1, FailStatus: http.StatusTooManyRequests, RetryAfter: "120"})
	b.receiver.Plan("days", receiver.Plan{FailFirst: 1, RetryAfter: "864000"})
	enqueue(t, b.pool, "soon", "webhook", []int{1})
	enqueue(t, b.pool, "days", "webhook", []int{2})
	want := map[string]string{"soon": statusPending, "days": statusDead}
	rows := claimRows(t, r, "webhook")
	require.Len(t, rows, 2)
	for _, row := range rows {
		r.deliver(t.Context(), inst, row)
		o := <-r.results
		require.Equal(t, want[row.key], o.status, *o.lastError)
		require.Contains(t, *o.lastError, "Retry-After", "%s: %s", row.key, *o.lastError)
	}
}
