package slack_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/internal/slacktest"
)

// A 502 or 504 answering a post is a gateway's answer for Slack: it passed the post on
// and then lost Slack's connection (502) or stopped waiting for its answer (504), so
// Slack may have posted, as after a connection reset of its own (the webhook connector
// classes them so). It was a plain retryable failure: the retry still looks first, but
// the row's mark tells of its latest attempt only, so a row whose last attempt met one
// ended dead as if nothing had been posted, and an operator would take a replay with a
// new key for safe.
func TestDeliver_GatewayAnswerToAPostIsAmbiguous(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusBadGateway, http.StatusGatewayTimeout} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, slack.Config{})
			b.f.Plan("k", slacktest.Plan{StatusAfterEffect: status})

			raw, err := b.c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Nil(t, raw)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.True(t, connectors.IsAmbiguous(err), "Slack may have posted behind the gateway: %v", err)
			require.Equal(t, 1, b.f.Effects("k"))

			d := delivery("k")
			retryReconciles(t, b, d)
		})
	}
}
