package slack_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/internal/slacktest"
)

// A Retry-After wins over the relay's backoff (DESIGN.md), whatever status to retry it
// comes with, as the webhook, Resend and payment connectors read it: a 503 of Slack's or
// of a proxy in front of it asks for a wait too. slack-go reads it only on a 429 (its
// StatusCodeError keeps the status alone), so the connector retried a 503, 500, 408,
// 409 or 425 with backoff, sooner than asked.
func TestDeliver_RetryAfterOfAnyStatusToRetry(t *testing.T) {
	t.Parallel()
	for _, status := range []int{
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable,
		http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly,
	} {
		for _, lookup := range []bool{false, true} {
			for _, date := range []bool{false, true} {
				t.Run(fmt.Sprintf("%d/Lookup=%t/Date=%t", status, lookup, date), func(t *testing.T) {
					t.Parallel()
					b := setup(t, slack.Config{})
					retryAfter := "3600"
					if date {
						retryAfter = time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
					}
					plan := slacktest.Plan{Status: status, RetryAfter: retryAfter}
					d := delivery("k")
					if lookup {
						b.f.PlanLookup(plan)
						d.Attempt = 2
					} else {
						b.f.Plan("k", plan)
					}
					_, err := b.c.Deliver(t.Context(), d)
					require.Error(t, err)
					require.False(t, connectors.IsPermanent(err), "%v", err)
					delay, ok := connectors.RetryDelay(err)
					require.True(t, ok, "the Retry-After was not read: %v", err)
					require.InDelta(t, time.Hour.Seconds(), delay.Seconds(), 5)
					// The classes are as they were: a 502 answering a post may follow one
					// Slack made (TestDeliver_GatewayAnswerToAPostIsAmbiguous).
					require.Equal(t, status == http.StatusBadGateway && !lookup, connectors.IsAmbiguous(err), "%v", err)
					require.Zero(t, b.f.Effects("k"))
				})
			}
		}
	}
}
