package webhook_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
)

// BenchmarkDeliver compares one Deliver with the bare keep-alive POST it makes, against
// the loopback receiver: the difference is what the connector adds to each attempt.
func BenchmarkDeliver(b *testing.B) {
	r, err := receiver.Start(receiver.Options{NoEffectLog: true})
	require.NoError(b, err)
	defer r.Close()
	payload := []byte(`{"data":"` + strings.Repeat("x", 480) + `"}`)
	var n atomic.Int64
	key := func(prefix string) string { return prefix + strconv.FormatInt(n.Add(1), 10) }

	b.Run("raw", func(b *testing.B) {
		tr := webhook.DefaultTransport()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequest(http.MethodPost, r.URL(), bytes.NewReader(payload))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key("raw-"))
				req.Header.Set("User-Agent", "outboxd")
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	})
	b.Run("deliver", func(b *testing.B) {
		c, err := webhook.New(webhook.Config{URL: r.URL(), Guarantee: connectors.Enforced})
		require.NoError(b, err)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Deliver(context.Background(), connectors.Delivery{Key: key("deliver-"), Attempt: 1, Payload: payload}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
