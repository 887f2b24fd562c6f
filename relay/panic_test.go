package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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

// answerError is a connector's own error type, as connectors written for one receiver
// have: the answer's status, and what it wraps.
type answerError struct {
	status int
	err    error
}

func (e *answerError) Error() string { return fmt.Sprintf("answered %d: %v", e.status, e.err) }
func (e *answerError) Unwrap() error { return e.err }

// statusError is one without Unwrap: only its message dereferences the pointer.
type statusError struct{ status int }

func (e *statusError) Error() string { return fmt.Sprintf("answered %d", e.status) }

// typedNilConnector makes Go's best-known mistake: it returns its own error type through
// a variable of that type, nil when the receiver took the request, which the error
// interface then holds as a non-nil error whose methods dereference a nil pointer.
type typedNilConnector struct{ unwraps bool }

func (c typedNilConnector) Deliver(context.Context, connectors.Delivery) (json.RawMessage, error) {
	if c.unwraps {
		var failed *answerError // set when the receiver refuses; it took the request
		return json.RawMessage(`{"status":200}`), failed
	}
	var failed *statusError
	return json.RawMessage(`{"status":200}`), failed
}

func (typedNilConnector) Guarantee() connectors.Guarantee { return connectors.Forwarded }

// A connector's panic is an ambiguous attempt (see TestConnectorPanicIsAnAmbiguousAttempt),
// but only while Deliver runs: the error it returns is looked at afterwards (what it
// wraps, its class, its message), outside the recover, on the delivery worker's
// goroutine. One whose methods panic, as a typed nil of the connector's own error type
// does, killed the whole process the relay is embedded in when the panic came from
// errors.As's Unwrap; restarted, it found the row's lease expired, sent it again as an
// ambiguous attempt's retry and died again. From Error alone, fmt's own recover made
// the attempt a plain failure, "attempt 1: <nil>", retried without a word that the
// receiver may have acted: sent again at a forwarded receiver with the hold policy.
func TestConnectorErrorThatPanicsIsAnAmbiguousAttempt(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]typedNilConnector{"Unwrap": {unwraps: true}, "Error": {}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			connectorErrorThatPanics(t, c)
		})
	}
}

func connectorErrorThatPanics(t *testing.T, c typedNilConnector) {
	pool, err := pgxpool.New(t.Context(), "postgres://relay@127.0.0.1:1/unused") // never dialled: New does not touch the database
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := New(pool, &Config{Logger: testLogger()}, map[string]Instance{
		"webhook": {Connector: c, OnAmbiguous: AmbiguousHold},
	})
	require.NoError(t, err)
	inst := r.instances["webhook"]
	now := time.Now()
	row := claimed{id: 1, key: "typed-nil", payload: json.RawMessage(`{}`), attempt: 1, createdAt: now,
		firstAt: now, claimedAt: now, lease: now.Add(r.cfg.Lease), local: now}

	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		r.deliver(t.Context(), inst, row)
	}()
	require.Nil(t, <-panicked, "the delivery worker panicked on the connector's error: the process the relay runs in dies")
	o := <-r.results
	require.True(t, o.ambiguous, "the request may have gone out: %+v", o)
	require.Equal(t, statusHeld, o.status, "ambiguous on a forwarded instance with the hold policy: held for an operator")
	require.Contains(t, *o.lastError, "connector panicked")
}
