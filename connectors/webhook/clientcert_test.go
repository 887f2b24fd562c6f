package webhook_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// A receiver that wants a client certificate (mutual TLS) the connector does not present
// (outboxd serve has none to present; a library's Config.Client may hold one that expired
// or that the receiver does not trust) refuses the TLS handshake. Under TLS 1.3 the
// client's side of the handshake ends before the server has checked its certificate, so
// net/http writes the request, and the server's alert ("certificate required", "bad
// certificate") comes where the answer should. The server never completed its
// handshake, so it never read the request: the attempt was reported ambiguous ("no
// readable answer after the request was sent; the receiver may have acted"), held by a
// forwarded instance with the hold policy, when nothing had reached the receiver. As for
// a receiver's certificate that does not verify (README, "Proxies and certificates"),
// nothing was sent, and the attempt is retried.
func TestDeliver_ClientCertificateRefusedIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	var reached atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = fmt.Fprint(w, "ok")
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: x509.NewCertPool()}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	for name, certs := range map[string][]tls.Certificate{
		"NoCertificate":        nil,
		"UntrustedCertificate": {selfSignedCert(t)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr := webhook.DefaultTransport().Clone()
			tr.TLSClientConfig = &tls.Config{
				RootCAs:      srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
				Certificates: certs,
				MinVersion:   tls.VersionTLS13,
			}
			t.Cleanup(tr.CloseIdleConnections)
			c, err := webhook.New(webhook.Config{URL: srv.URL + "/hook", Client: &http.Client{Transport: tr}})
			require.NoError(t, err)

			raw, err := c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Nil(t, raw)
			require.Zero(t, reached.Load(), "the receiver never saw a request")
			require.False(t, connectors.IsAmbiguous(err), "the receiver refused the handshake: %v", err)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.ErrorContains(t, err, "POST "+connectors.RedactEndpoint(srv.URL+"/hook")+": the request could not be sent: remote error: tls: ")
		})
	}
}

func selfSignedCert(t *testing.T) tls.Certificate {
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
