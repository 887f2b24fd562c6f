package payment_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/payment"
)

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
			ct := &connectortest.CountingTransport{Next: tr, StopAt: 32 << 20}
			c, err := payment.New(payment.Config{APIKey: testKey, APIBase: srv.URL, HTTPClient: &http.Client{Transport: ct}})
			require.NoError(t, err)

			raw, err := c.Deliver(t.Context(), delivery("huge:"+http.StatusText(status), `{"operation":"customer.create","params":{}}`))
			require.Error(t, err)
			t.Logf("read %d bytes; error: %v", ct.Read(), err)
			require.LessOrEqual(t, ct.Read(), int64(2<<20), "the connector reads an answer of any size whole")
			require.NotContains(t, err.Error(), connectortest.ErrReadPastBound.Error())
			require.Less(t, len(err.Error()), 1000)
			require.Less(t, len(raw), 1000)
			if status == http.StatusOK {
				require.True(t, connectors.IsAmbiguous(err), "a 2xx Stripe may have acted on: %v", err)
			}
		})
	}
}
