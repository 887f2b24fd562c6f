package relay

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// stoppedBeforeSend is the webhook connector, except that an attempt waits, once it has
// started (entered is closed), until its context ends, and only then goes on: as an
// attempt still connecting (a slow dial, an SMTP greeting) when the shutdown timeout
// cancels it. The webhook then sends nothing, and says so.
type stoppedBeforeSend struct {
	*webhook.Connector
	once    sync.Once
	entered chan struct{}
}

func (s *stoppedBeforeSend) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	s.once.Do(func() { close(s.entered) })
	<-ctx.Done()
	return s.Connector.Deliver(ctx, d)
}

// An attempt the shutdown timeout cancelled before anything was sent, which its
// connector reports as such (an error it does not mark ambiguous), is no attempt: the
// row goes back as one never started, not ambiguous and its attempt not counted. The
// relay made every cancelled attempt ambiguous, whatever the connector said: with the
// hold policy the row was held for an operator, though the receiver never heard of it,
// and on its last attempt it went to dead.
func TestAttemptStoppedBeforeSendingIsNotCounted(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		guarantee   connectors.Guarantee
		onAmbiguous string
		maxAttempts int
	}{
		"forwarded, hold":        {connectors.Forwarded, AmbiguousHold, 0},
		"enforced, last attempt": {connectors.Enforced, "", 1},
		"forwarded, retry, last": {connectors.Forwarded, AmbiguousRetry, 1},
		"enforced, first of 5":   {connectors.Enforced, "", 5},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: tc.guarantee, Timeout: 5 * time.Second})
			require.NoError(t, err)
			conn := &stoppedBeforeSend{Connector: hook, entered: make(chan struct{})}
			cfg := b.fastConfig()
			cfg.ShutdownTimeout = 50 * time.Millisecond
			cfg.MaxAttempts = tc.maxAttempts
			_, stop := start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: conn, OnAmbiguous: tc.onAmbiguous}})
			enqueue(t, b.pool, "stopped", "webhook", []int{1})
			waitFor(t, conn.entered, "the row never reached the connector")
			stop()

			in, err := outbox.Get(t.Context(), b.pool, "stopped")
			require.NoError(t, err)
			var ambiguous bool
			require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT ambiguous FROM outbox WHERE idempotency_key = 'stopped'`).Scan(&ambiguous))
			t.Logf("status=%s attempts=%d ambiguous=%v last_error=%q", in.Status, in.Attempts, ambiguous, in.LastError)
			require.Zero(t, b.receiver.Requests("stopped"), "nothing was sent")
			require.Equal(t, outbox.StatusPending, in.Status)
			require.Zero(t, in.Attempts, "the attempt that sent nothing is not counted")
			require.False(t, ambiguous)
			require.Empty(t, attemptsOf(t, b.pool, "stopped"))
			requireNoLeases(t, b.pool)
		})
	}
}

// answeredAtStop answers, as the shutdown timeout strikes, with a receiver's 503 and a
// Retry-After of an hour: an answer, not the cancel.
type answeredAtStop struct {
	connectors.Connector
	once    sync.Once
	entered chan struct{}
}

func (a *answeredAtStop) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	a.once.Do(func() { close(a.entered) })
	<-ctx.Done()
	return json.RawMessage(`{"status":503}`), connectors.RetryAfter(errors.New("receiver answered 503 Service Unavailable"), time.Hour)
}

// A receiver's answer that comes as the shutdown timeout cancels the attempt is an
// attempt like any other: counted, logged, not ambiguous, its Retry-After kept. It was
// taken for an attempt that sent nothing (handed back uncounted, unlogged, due at once),
// and before that for an ambiguous one.
func TestAnswerAtTheShutdownTimeoutIsAnAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	conn := &answeredAtStop{Connector: b.hook, entered: make(chan struct{})}
	cfg := b.fastConfig()
	cfg.ShutdownTimeout = 50 * time.Millisecond
	_, stop := start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	enqueue(t, b.pool, "answered", "webhook", []int{1})
	waitFor(t, conn.entered, "the row never reached the connector")
	stop()

	in, err := outbox.Get(t.Context(), b.pool, "answered")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
	require.Equal(t, 1, in.Attempts, "the attempt is counted")
	require.Contains(t, in.LastError, "503")
	var ambiguous, later bool
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT ambiguous, next_attempt_at > now() + interval '50 minutes'
		FROM outbox WHERE idempotency_key = 'answered'`).Scan(&ambiguous, &later))
	require.False(t, ambiguous, "the receiver answered")
	require.True(t, later, "its Retry-After is kept")
	att := attemptsOf(t, b.pool, "answered")
	require.Len(t, att, 1)
	require.Equal(t, "retry", att[0].Outcome)
	requireNoLeases(t, b.pool)
}
