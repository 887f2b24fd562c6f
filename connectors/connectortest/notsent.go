package connectortest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// DeliverResetBeforeTheRequestLeft checks that an attempt whose connection the receiver
// (or a load balancer in front of it) resets just as the request is put on it is a plain
// retryable failure, not ambiguous: a keep-alive connection it timed out
// ("IdleKeepAlive", after a first delivery answered with answer, a whole HTTP/1.1
// response), or a new one it refuses work on ("NewConnection"). net/http has the
// request in the connection's write buffer and reports it written before it flushes
// that; the flush then fails, and not a byte reaches the receiver. newConnector builds
// the connector for url with its shared transport, as in production; warmUp and d are
// the deliveries.
func DeliverResetBeforeTheRequestLeft(t *testing.T, answer string, newConnector func(url string) connectors.Connector, warmUp, d connectors.Delivery) {
	for _, reused := range []bool{true, false} {
		name := map[bool]string{true: "IdleKeepAlive", false: "NewConnection"}[reused]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resetNow, reset := make(chan struct{}), make(chan struct{})
			var requests atomic.Int64
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			ServeConns(t, ln, func(c net.Conn) {
				if reused {
					req, err := http.ReadRequest(bufio.NewReader(c))
					if err != nil {
						return
					}
					requests.Add(1)
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = io.WriteString(c, answer)
				}
				<-resetNow // until the next request is being written on the connection
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close() // RST
				close(reset)
			})
			c := newConnector("http://" + ln.Addr().String())
			if reused {
				_, err = c.Deliver(t.Context(), warmUp)
				require.NoError(t, err)
			}

			// The hook runs in net/http's write loop once the request's headers are in the
			// connection's buffer, before anything of the request is flushed to it.
			ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
				WroteHeaders: func() {
					close(resetNow)
					<-reset
				},
			})
			requireNotSent(t, ctx, c, d)
			require.Equal(t, map[bool]int64{true: 1, false: 0}[reused], requests.Load(), "only a warm-up reached the receiver")
		})
	}
}

// DeliverToARefusedHandshake checks that an attempt at a receiver that wants a client
// certificate (mutual TLS) the connector does not present, or does not trust, is a plain
// retryable failure, not ambiguous. Under TLS 1.3 the client's side of the handshake
// ends before the server has checked its certificate, so net/http writes the request,
// and the server's alert comes where the answer should; the server never completed its
// handshake, so it never read the request. newConnector builds the connector for url
// with client (a clone of base that trusts the receiver and presents the certificate).
func DeliverToARefusedHandshake(t *testing.T, base *http.Transport, newConnector func(url string, client *http.Client) connectors.Connector, d connectors.Delivery) {
	var reached atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: x509.NewCertPool()}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	for name, certs := range map[string][]tls.Certificate{
		"NoCertificate":        nil,
		"UntrustedCertificate": {selfSignedClientCert(t)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr := base.Clone()
			tr.TLSClientConfig = &tls.Config{
				RootCAs:      srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
				Certificates: certs,
				MinVersion:   tls.VersionTLS13,
			}
			t.Cleanup(tr.CloseIdleConnections)
			requireNotSent(t, t.Context(), newConnector(srv.URL, &http.Client{Transport: tr}), d)
			require.Zero(t, reached.Load(), "the receiver never saw a request")
		})
	}
}

// requireNotSent delivers d with c and requires a retryable failure that says nothing
// was sent.
func requireNotSent(t *testing.T, ctx context.Context, c connectors.Connector, d connectors.Delivery) {
	t.Helper()
	raw, err := c.Deliver(ctx, d)
	require.Error(t, err)
	require.Equal(t, json.RawMessage(nil), raw)
	require.False(t, connectors.IsAmbiguous(err), "nothing of the request was read: %v", err)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, "the request could not be sent")
}

func selfSignedClientCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Unix(0, 0),
		NotAfter:     time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
