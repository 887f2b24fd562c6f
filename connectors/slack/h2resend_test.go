package slack_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/slack"
)

// One attempt is one chat.postMessage: the relay owns retries, and a post sent again
// within an attempt is a second message the relay never sees (package doc: slack-go's
// retries are off for that reason). net/http's HTTP/2 transport resent the post on its
// own after a stream reset with REFUSED_STREAM or PROTOCOL_ERROR that came after Slack (or
// a proxy before it) took the whole request, because slack-go sets GetBody: seven posts
// in one attempt. The webhook, payment and Resend connectors send their requests
// without GetBody for this reason.
func TestDeliver_HTTP2ResetAfterThePostIsNotResent(t *testing.T) {
	t.Parallel()
	for name, code := range map[string]uint32{"RefusedStream": connectortest.H2RefusedStream, "ProtocolError": connectortest.H2ProtocolError} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := &connectortest.H2Refuser{ResetCode: code}
			base, client := l.Start(t, http.DefaultTransport.(*http.Transport)) // ForceAttemptHTTP2
			c, err := slack.New(slack.Config{Token: "xoxb-1-2-secret", APIBase: base + "/api/", HTTPClient: client, Timeout: 5 * time.Second})
			require.NoError(t, err)

			raw, err := c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Nil(t, raw)
			require.True(t, connectors.IsAmbiguous(err), "the whole post was sent: %v", err)
			require.Equal(t, int64(1), l.Requests(), "the transport posted again on its own")
		})
	}
}
