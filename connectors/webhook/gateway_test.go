package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
)

// A receiver behind a reverse proxy performs the effect and drops the connection: the
// proxy answers 502 Bad Gateway. The receiver may well have acted, so the attempt is
// ambiguous (a forwarded instance with the hold policy holds it instead of sending a
// second effect); it is still retried.
func TestDeliver_GatewayErrorAfterEffectIsAmbiguous(t *testing.T) {
	t.Parallel()
	r, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	upstream, err := url.Parse(r.URL())
	require.NoError(t, err)
	proxy := httptest.NewServer(httputil.NewSingleHostReverseProxy(upstream))
	t.Cleanup(proxy.Close)
	c, err := webhook.New(webhook.Config{URL: proxy.URL + upstream.Path, Client: testClient(t)})
	require.NoError(t, err)

	const key = "order-42/notify"
	r.Plan(key, receiver.Plan{DropAfterEffect: 1})
	raw, err := c.Deliver(t.Context(), delivery(key))
	require.Error(t, err)
	require.Equal(t, http.StatusBadGateway, decodeResult(t, raw).Status)
	require.Equal(t, 1, r.Effects(key), "the receiver acted")
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.True(t, connectors.IsAmbiguous(err), "a gateway's error after the receiver acted was classified as not acted: %v", err)
}

// 504 Gateway Timeout: the gateway gave up waiting for the receiver, which may act.
func TestDeliver_GatewayTimeoutIsAmbiguous(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{}, webhook.Config{})
	b.r.Plan("k504", receiver.Plan{FailFirst: 1, FailStatus: http.StatusGatewayTimeout})
	_, err := b.c.Deliver(t.Context(), delivery("k504"))
	require.Error(t, err)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
}

// Cloudflare, in front of many receivers, answers for its origin with codes of its own:
// 520 when the origin reset the connection or answered nothing after taking the request
// (its 502), 524 when the origin took the request and did not answer within its time
// limit (its 504). The origin may have acted, as behind any gateway. 521, 522 and 523 say
// Cloudflare could not reach the origin at all, so nothing reached it.
func TestDeliver_CloudflareOriginErrorsAreAmbiguous(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{}, webhook.Config{})
	for status, ambiguous := range map[int]bool{520: true, 524: true, 521: false, 522: false, 523: false} {
		key := "cloudflare-" + strconv.Itoa(status)
		b.r.Plan(key, receiver.Plan{FailFirst: 1, FailStatus: status})
		raw, err := b.c.Deliver(t.Context(), delivery(key))
		require.Error(t, err)
		require.Equal(t, status, decodeResult(t, raw).Status)
		require.False(t, connectors.IsPermanent(err), "%d: %v", status, err)
		require.Equal(t, ambiguous, connectors.IsAmbiguous(err), "%d: %v", status, err)
	}
}
