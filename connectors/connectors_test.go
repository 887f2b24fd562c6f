package connectors_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

func TestClassification(t *testing.T) {
	t.Parallel()
	base := errors.New("receiver answered 503")

	require.False(t, connectors.IsPermanent(base))
	require.False(t, connectors.IsAmbiguous(base))
	_, ok := connectors.RetryDelay(base)
	require.False(t, ok)

	perm := fmt.Errorf("deliver: %w", connectors.Permanent(base))
	require.True(t, connectors.IsPermanent(perm))
	require.ErrorIs(t, perm, base)
	require.Equal(t, "deliver: receiver answered 503", perm.Error())

	delayed := connectors.Ambiguous(connectors.RetryAfter(base, 3*time.Second))
	require.True(t, connectors.IsAmbiguous(delayed))
	require.False(t, connectors.IsPermanent(delayed))
	d, ok := connectors.RetryDelay(delayed)
	require.True(t, ok)
	require.Equal(t, 3*time.Second, d)

	joined := errors.Join(errors.New("other"), connectors.Permanent(base))
	require.True(t, connectors.IsPermanent(joined))

	require.NoError(t, connectors.Permanent(nil))
	require.NoError(t, connectors.RetryAfter(nil, time.Second))
	require.NoError(t, connectors.Ambiguous(nil))

	set := connectors.Set{}
	_, err := set.Get("webhook")
	require.ErrorIs(t, err, connectors.ErrUnknownConnector)
}

func TestHelpers(t *testing.T) {
	t.Parallel()
	require.Equal(t, "503 Service Unavailable", connectors.StatusText(503))
	require.Equal(t, "599", connectors.StatusText(599))

	require.Equal(t, "a b c", connectors.Excerpt(" a\n\tb  c ", 10))
	require.Equal(t, "héé…", connectors.Excerpt("hééé", 6), "cut on a character boundary")
	require.Equal(t, "\uFFFD", connectors.Excerpt("\xff", 10))

	require.Equal(t, `{"body":"<p>&</p>"}`, string(connectors.MarshalResult(map[string]string{"body": "<p>&</p>"})))
	require.Panics(t, func() { connectors.MarshalResult(make(chan int)) })
	// Encoders are reused between calls; a result never shares their buffer.
	first := connectors.MarshalResult(map[string]int{"status": 200})
	_ = connectors.MarshalResult(map[string]string{"body": "a longer answer that would overwrite it"})
	require.Equal(t, `{"status":200}`, string(first))
	require.Equal(t, `{"status":201}`, string(connectors.MarshalResult(map[string]int{"status": 201})), "encodes again after a panic")

	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	d, ok := connectors.ParseRetryAfter("120", now)
	require.True(t, ok)
	require.Equal(t, 2*time.Minute, d)
	d, ok = connectors.ParseRetryAfter(now.Add(time.Hour).Format(http.TimeFormat), now)
	require.True(t, ok)
	require.Equal(t, time.Hour, d)
	_, ok = connectors.ParseRetryAfter("soon", now)
	require.False(t, ok)
}

func TestRetryableStatus(t *testing.T) {
	t.Parallel()
	for _, code := range []int{408, 409, 425, 429, 500, 502, 503, 504, 599} {
		require.True(t, connectors.RetryableStatus(code), "%d", code)
	}
	for _, code := range []int{200, 301, 303, 400, 401, 403, 404, 410, 422, 451, 600, 999} {
		require.False(t, connectors.RetryableStatus(code), "%d", code)
	}
}

type wrappedTransport struct{ http.RoundTripper }

// An application may put a RoundTripper of its own in http.DefaultTransport (an
// instrumenting wrapper): every connector's shared transport is built from it, and a type
// assertion there panicked in New, for the payment, Slack and Resend connectors too.
// Not parallel: it changes a global.
func TestCloneDefaultTransportOfAReplacedOne(t *testing.T) {
	def := http.DefaultTransport
	t.Cleanup(func() { http.DefaultTransport = def })

	require.NotSame(t, def, connectors.CloneDefaultTransport())
	http.DefaultTransport = wrappedTransport{def}
	var tr *http.Transport
	require.NotPanics(t, func() { tr = connectors.CloneDefaultTransport() })
	require.NotNil(t, tr.Proxy, "proxy settings from the environment, as net/http's default")
	require.True(t, tr.ForceAttemptHTTP2)
}
