package payment_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
)

// countingTransport counts the answer bytes read through it, and fails a read past
// stopAt so that the test's memory stays bounded when the connector does not.
type countingTransport struct {
	next   http.RoundTripper
	read   atomic.Int64
	stopAt int64
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if resp != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, t: t}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	t *countingTransport
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.t.read.Load() >= b.t.stopAt {
		return 0, errors.New("test: the connector read past the test's bound")
	}
	n, err := b.ReadCloser.Read(p)
	b.t.read.Add(int64(n))
	return n, err
}

// An answer without end (a misconfigured proxy streaming a file, a stand-in gone wrong):
// stripe-go reads every answer whole (io.ReadAll) with no bound, so each attempt held all
// it could read within its time limit (30 s by default; gigabytes on a fast link), at up
// to the relay's concurrency at once. The other HTTP connectors bound what they read of
// an answer (Resend 64 KiB; the webhook OUTBOX_WEBHOOK_MAX_RESULT_BODY), and the shared
// transport bounds the headers (MaxAnswerHeaderBytes) for this very reason.
func TestHugeAnswerIsNotReadWhole(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusOK, http.StatusBadRequest} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `{"object":"customer","id":"cus_1","pad":"`)
				chunk := strings.Repeat("a", 64<<10)
				for r.Context().Err() == nil {
					if _, err := io.WriteString(w, chunk); err != nil {
						return
					}
				}
			}))
			t.Cleanup(srv.Close)
			tr := payment.DefaultTransport().Clone()
			t.Cleanup(tr.CloseIdleConnections)
			ct := &countingTransport{next: tr, stopAt: 32 << 20}
			c, err := payment.New(payment.Config{APIKey: testKey, APIBase: srv.URL, HTTPClient: &http.Client{Transport: ct}})
			require.NoError(t, err)

			raw, err := c.Deliver(t.Context(), delivery("huge:"+http.StatusText(status), `{"operation":"customer.create","params":{}}`))
			require.Error(t, err)
			t.Logf("read %d bytes; error: %v", ct.read.Load(), err)
			require.LessOrEqual(t, ct.read.Load(), int64(2<<20), "the connector reads an answer of any size whole")
			require.NotContains(t, err.Error(), "test: the connector read past")
			require.Less(t, len(err.Error()), 1000)
			require.Less(t, len(raw), 1000)
			if status == http.StatusOK {
				require.True(t, connectors.IsAmbiguous(err), "a 2xx Stripe may have acted on: %v", err)
			}
		})
	}
}
