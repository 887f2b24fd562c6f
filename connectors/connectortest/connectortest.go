package connectortest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// Harness describes one connector under test and its receiver.
type Harness struct {
	// Connector is the connector under test, pointed at the receiver. Required.
	Connector connectors.Connector
	// PayloadFunc returns a valid payload for the i-th delivery of the run (i counts
	// from 0, distinct for every delivery). Required.
	PayloadFunc func(i int) json.RawMessage
	// EffectsFunc reports how many times the receiver performed the effect for key.
	// Required.
	EffectsFunc func(key string) int
	// DropAfterEffectFunc makes the receiver perform the next effect for key and then
	// drop the connection without answering. Required.
	DropAfterEffectFunc func(key string)
	// RequestsFunc, when set, reports how many requests carrying key reached the
	// receiver, whatever they were answered. With it, the retry checks of an enforced
	// connector also prove that the retry went out under the very key of the first
	// attempt: EffectsFunc alone cannot see an effect performed under another key (a
	// connector that made a fresh key per attempt would show one effect for the row's
	// key, and a second one under a key nobody asks about). Optional.
	RequestsFunc func(key string) int
	// Concurrency is how many deliveries of distinct keys run at once in the concurrency
	// check. Defaults to 50.
	Concurrency int
}

// Run runs the conformance checks against h as parallel subtests of t; see the package
// documentation for what they are.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.Connector, "Harness.Connector is required")
	require.NotNil(t, h.PayloadFunc, "Harness.PayloadFunc is required")
	require.NotNil(t, h.EffectsFunc, "Harness.EffectsFunc is required")
	require.NotNil(t, h.DropAfterEffectFunc, "Harness.DropAfterEffectFunc is required")
	s := &suite{h: h, run: rand.Text()[:10]}
	if s.h.Concurrency <= 0 {
		s.h.Concurrency = 50
	}
	g := h.Connector.Guarantee()
	dedupes := g == connectors.Enforced || g == connectors.Reconciled

	t.Run("Guarantee", func(t *testing.T) {
		t.Parallel()
		require.Contains(t, []connectors.Guarantee{connectors.Enforced, connectors.Reconciled, connectors.Forwarded}, g)
	})

	t.Run("Delivers", func(t *testing.T) {
		t.Parallel()
		r := s.row(t)
		res, err := s.deliver(t.Context(), r, 1, false)
		require.NoError(t, err)
		requireResult(t, res)
		require.Equal(t, 1, h.EffectsFunc(r.key), "the receiver performed one effect under the key given")
	})

	t.Run("RetryOfDeliveredKey", func(t *testing.T) {
		t.Parallel()
		r := s.row(t)
		_, err := s.deliver(t.Context(), r, 1, false)
		require.NoError(t, err)
		require.Equal(t, 1, h.EffectsFunc(r.key))

		// Not marked ambiguous: a plain failure after an ambiguous attempt clears the mark,
		// so a reconciling connector must look on every attempt after the first (see
		// connectors.Delivery.PreviousAmbiguous).
		res, err := s.deliver(t.Context(), r, 2, false)
		require.NoError(t, err, "a retry of a delivered key succeeds")
		requireResult(t, res)
		if dedupes {
			require.Equal(t, 1, h.EffectsFunc(r.key), "a %s connector's retry performs no second effect", g)
			s.requireRetrySameKey(t, g, r.key)
		} else {
			require.GreaterOrEqual(t, h.EffectsFunc(r.key), 1)
		}
	})

	t.Run("DropAfterEffect", func(t *testing.T) {
		t.Parallel()
		r := s.row(t)
		h.DropAfterEffectFunc(r.key)
		_, err := s.deliver(t.Context(), r, 1, false)
		require.Error(t, err, "the receiver dropped the connection without answering")
		require.False(t, connectors.IsPermanent(err), "a dropped connection is not permanent: %v", err)
		if g == connectors.Forwarded {
			require.True(t, connectors.IsAmbiguous(err),
				"a forwarded connector must mark a drop after the request was sent ambiguous: %v", err)
		}
		require.Equal(t, 1, h.EffectsFunc(r.key), "the receiver acted before dropping (check the harness)")

		res, err := s.deliver(t.Context(), r, 2, true)
		require.NoError(t, err, "the retry with the same key succeeds")
		requireResult(t, res)
		if dedupes {
			require.Equal(t, 1, h.EffectsFunc(r.key), "a %s connector's retry after an ambiguous attempt performs no second effect", g)
			s.requireRetrySameKey(t, g, r.key)
		}
	})

	t.Run("CancelledContext", func(t *testing.T) {
		t.Parallel()
		r := s.row(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := s.deliver(ctx, r, 1, false)
		require.Error(t, err)
		require.False(t, connectors.IsPermanent(err), "a cancelled attempt is not permanent: %v", err)
		require.Equal(t, 0, h.EffectsFunc(r.key))
	})

	t.Run("ConcurrentDistinctKeys", func(t *testing.T) {
		t.Parallel()
		rows := make([]row, s.h.Concurrency)
		errs := make([]error, len(rows))
		var wg sync.WaitGroup
		for i := range rows {
			rows[i] = s.row(t)
			wg.Go(func() { _, errs[i] = s.deliver(t.Context(), rows[i], 1, false) })
		}
		wg.Wait()
		for i, r := range rows {
			require.NoError(t, errs[i], "key %s", r.key)
			require.Equal(t, 1, h.EffectsFunc(r.key), "key %s", r.key)
		}
	})
}

type suite struct {
	h    Harness
	run  string // random per Run, so keys never repeat across runs
	rows atomic.Int64
}

// row is one outbox row: its key and payload stay the same on every attempt.
type row struct {
	key     string
	payload json.RawMessage
}

// row returns a fresh row whose key names the subtest. The key has a colon and a slash in
// it, as real keys do (outbox.Key joins parts with colons), so a connector that mangles
// either shows.
func (s *suite) row(t *testing.T) row {
	name := t.Name()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	i := int(s.rows.Add(1) - 1)
	return row{
		key:     fmt.Sprintf("connectortest:%s:%s/%d", s.run, name, i),
		payload: s.h.PayloadFunc(i),
	}
}

func (s *suite) deliver(ctx context.Context, r row, attempt int, previousAmbiguous bool) (json.RawMessage, error) {
	return s.h.Connector.Deliver(ctx, connectors.Delivery{
		Key:               r.key,
		Attempt:           attempt,
		Payload:           r.payload,
		Headers:           map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		PreviousAmbiguous: previousAmbiguous,
	})
}

// requireRetrySameKey checks, when the harness can tell, that an enforced connector's
// retry reached the receiver under the first attempt's key: two requests carried it.
func (s *suite) requireRetrySameKey(t *testing.T, g connectors.Guarantee, key string) {
	t.Helper()
	if s.h.RequestsFunc == nil || g != connectors.Enforced {
		return
	}
	require.Equal(t, 2, s.h.RequestsFunc(key),
		"the attempt and its retry both reached the receiver under key %q (a retry under another key would act again)", key)
}

func requireResult(t *testing.T, res json.RawMessage) {
	t.Helper()
	require.NotEmpty(t, res, "a successful delivery returns a result to store")
	require.True(t, json.Valid(res), "the result is JSON: %s", res)
}
