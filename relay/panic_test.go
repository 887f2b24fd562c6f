package relay

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// panicsAfterSend delivers through a webhook, then panics (reading the answer, say): the
// receiver has acted.
type panicsAfterSend struct{ *webhook.Connector }

func (c panicsAfterSend) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	if _, err := c.Connector.Deliver(ctx, d); err != nil {
		return nil, err
	}
	panic("decoding the answer")
}

// A connector that panics may have sent its request first: the relay cannot know
// whether the receiver acted, so the attempt is ambiguous, as one whose relay died
// mid-attempt is once its lease expires. Taken for a plain retry, a forwarded
// connector with the hold policy sent the row again (a second effect at a receiver that
// does not enforce the key), and a reconciled one would retry without looking first.
func TestConnectorPanicIsAnAmbiguousAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
	require.NoError(t, err)
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: panicsAfterSend{hook}, OnAmbiguous: AmbiguousHold}})
	enqueue(t, b.pool, "panics", "webhook", []int{1})

	var first attemptRow
	require.Eventually(t, func() bool {
		if a := attemptsOf(t, b.pool, "panics"); len(a) > 0 {
			first = a[0]
			return true
		}
		return false
	}, waitTimeout, 10*time.Millisecond)
	require.True(t, first.Ambiguous, "the attempt that panicked is recorded as ambiguous: %+v", first)
	require.Equal(t, outbox.StatusHeld, first.Outcome, "%+v", first)
	waitStatus(t, b.pool, "panics", outbox.StatusHeld)
	require.Equal(t, 1, b.receiver.Effects("panics"), "sent once, then held for an operator")
	// The log has where it panicked, for whoever fixes the connector; last_error only the value.
	require.Contains(t, logs.String(), "connector panicked")
	require.Contains(t, logs.String(), "panicsAfterSend.Deliver")
	in, err := outbox.Get(t.Context(), b.pool, "panics")
	require.NoError(t, err)
	require.NotContains(t, in.LastError, "goroutine")
}
