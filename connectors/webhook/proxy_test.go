package webhook_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// A proxy's refusal read as the receiver's. Through a proxy (DefaultTransport takes it
// from HTTPS_PROXY, HTTP_PROXY and NO_PROXY), an https URL's tunnel refused by the proxy
// failed with "the request could not be sent: Bad Gateway", and an http URL's request
// with "receiver answered 407 Proxy Authentication Required", sending every row dead,
// with nothing to tell the operator to look at the proxy rather than the receiver.
// Errors now name the proxy, without its credentials.
func TestDeliver_ProxyRefusalNamesTheProxy(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	connectortest.ServeConns(t, ln, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
	})
	proxy := "http://" + ln.Addr().String()
	proxyURL, err := url.Parse("http://relay:pr0xy-pass@" + ln.Addr().String())
	require.NoError(t, err)
	tr := webhook.DefaultTransport().Clone()
	tr.Proxy = http.ProxyURL(proxyURL)
	t.Cleanup(tr.CloseIdleConnections)

	for _, target := range []string{"https://hooks.example.com/hook", "http://hooks.example.com/hook"} {
		c, err := webhook.New(webhook.Config{URL: target, Client: &http.Client{Transport: tr}})
		require.NoError(t, err)
		_, err = c.Deliver(t.Context(), delivery("k"))
		require.Error(t, err)
		require.False(t, connectors.IsAmbiguous(err), "the proxy did not pass the request on: %v", err)
		require.ErrorContains(t, err, "POST "+connectors.RedactEndpoint(target)+" (through the proxy "+proxy+"): ")
		require.NotContains(t, err.Error(), "pr0xy-pass")
		require.False(t, strings.Contains(err.Error(), "relay:"), "%v", err)
	}

	// Without a proxy, errors are as before.
	direct := webhook.DefaultTransport().Clone()
	direct.Proxy = nil
	t.Cleanup(direct.CloseIdleConnections)
	url := rawReceiver(t, func(c net.Conn) {
		_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
	})
	c, err := webhook.New(webhook.Config{URL: url, Client: &http.Client{Transport: direct}})
	require.NoError(t, err)
	_, err = c.Deliver(t.Context(), delivery("k"))
	require.ErrorContains(t, err, "POST "+connectors.RedactEndpoint(url)+": receiver answered 404 Not Found")
}
