package webhook_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// Over HTTP/2 too, the transport never sends a row's request a second time by itself.
// net/http's HTTP/2 transport resends a request refused with REFUSED_STREAM, or caught by
// a GOAWAY that says it was not processed, whenever it can rewind the body; a receiver
// (or a proxy before it) that says so after acting would then act twice within one
// attempt, unseen by the relay, on an instance that does not dedupe. The connector
// leaves the request without GetBody, so the attempt ends instead, ambiguous, and the
// relay decides.
func TestDeliver_HTTP2RefusalAfterTheRequestIsNotResent(t *testing.T) {
	t.Parallel()
	for name, goAway := range map[string]bool{"RefusedStream": false, "GoAway": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := &connectortest.H2Refuser{GoAway: goAway}
			base, client := l.Start(t, webhook.DefaultTransport()) // ForceAttemptHTTP2, as in production
			c, err := webhook.New(webhook.Config{URL: base + "/hook", Client: client, Timeout: 5 * time.Second})
			require.NoError(t, err)

			raw, err := c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Nil(t, raw)
			require.True(t, connectors.IsAmbiguous(err), "the whole request was sent: %v", err)
			require.NotErrorIs(t, err, webhook.ErrTimeout, "the attempt ended at the refusal")
			require.Equal(t, int64(1), l.Requests(), "the transport did not resend on its own")
		})
	}
}
