package webhook_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// A receiver that answers 2xx and then stalls its body past the attempt's time limit
// has acted and said so: the attempt is a success (the row is delivered, never sent
// again), with what came of the body, marked truncated. A 4xx or 5xx that stalls is
// classified by its status as ever.
func TestDeliver_AnswerWhoseBodyStallsIsClassifiedByItsStatus(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status    string
		wantErr   bool
		retryable bool
	}{
		{"200 OK", false, false},
		{"503 Service Unavailable", true, true},
		{"400 Bad Request", true, false},
	} {
		t.Run(tt.status, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			url := rawReceiver(t, func(c net.Conn) {
				_, _ = io.WriteString(c, "HTTP/1.1 "+tt.status+"\r\nContent-Length: 100\r\n\r\npartial")
				<-release // the rest never comes while the attempt lasts
			})
			t.Cleanup(func() { close(release) }) // before rawReceiver's, which waits for this handler
			c, err := webhook.New(webhook.Config{URL: url, Timeout: time.Second, Client: testClient(t)})
			require.NoError(t, err)

			raw, err := c.Deliver(t.Context(), delivery("k"))
			res := decodeResult(t, raw)
			require.Equal(t, "partial", res.Body)
			require.True(t, res.Truncated)
			if !tt.wantErr {
				require.NoError(t, err, "the receiver answered 2xx: delivered")
				return
			}
			require.Error(t, err)
			require.False(t, connectors.IsAmbiguous(err), "an answer came: %v", err)
			require.Equal(t, !tt.retryable, connectors.IsPermanent(err), "%v", err)
			require.NotErrorIs(t, err, webhook.ErrTimeout)
		})
	}
}
