package slack_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/internal/slacktest"
)

// Slack's Web API answers every call with "ok": true, or false and an error code.
// slack-go takes an answer with neither (a service other than Slack's behind APIBase, a
// proxy's own reply) for a success, so a post so answered was stored as delivered with
// no ts, though nothing may have been posted, and a lookup so answered was read as an
// empty conversation, after which the retry posted again.
func TestDeliver_AnswerWithoutOK(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{}`, `{"ok":false}`, `{"status":"ok","ts":"1.2"}`} {
		t.Run(body, func(t *testing.T) {
			t.Parallel()
			t.Run("Post", func(t *testing.T) {
				t.Parallel()
				b := setup(t, slack.Config{})
				b.f.Plan("k", slacktest.Plan{Body: body})
				raw, err := b.c.Deliver(t.Context(), delivery("k"))
				require.Error(t, err, "stored %s", raw)
				require.Contains(t, err.Error(), `without Slack's "ok"`)
				require.False(t, connectors.IsPermanent(err), "%v", err)
				require.True(t, connectors.IsAmbiguous(err), "what answered may have passed the post on: %v", err)
			})
			for _, thread := range []bool{false, true} {
				t.Run(fmt.Sprintf("Lookup/Thread=%t", thread), func(t *testing.T) {
					t.Parallel()
					b := setup(t, slack.Config{})
					d := messageOrReply(t, b, "k", thread)
					b.f.PlanLookup(slacktest.Plan{Body: body})
					d.Attempt, d.PreviousAmbiguous = 2, true
					_, err := b.c.Deliver(t.Context(), d)
					require.Error(t, err)
					require.Contains(t, err.Error(), `without Slack's "ok"`)
					require.False(t, connectors.IsPermanent(err), "%v", err)
					require.False(t, connectors.IsAmbiguous(err), "a lookup acts on nothing: %v", err)
					require.Zero(t, b.f.Posts("k"), "no post without a lookup Slack answered")
				})
			}
		})
	}
}

// A post answered "ok": true without the message's ts, which Slack always gives, was
// stored as delivered with an empty ts: no answer of Slack's, and nothing to find the
// message by.
func TestDeliver_PostAnsweredWithoutTS(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	b.f.Plan("k", slacktest.Plan{Body: `{"ok":true,"channel":"C0TEST"}`})
	raw, err := b.c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err, "stored %s", raw)
	require.Contains(t, err.Error(), "without the message's ts")
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
}

// A lookup answered "ok": true without "messages", which Slack always gives (an empty
// list for a conversation with none since the first attempt), was read as a conversation
// without the key, and the retry posted again: no answer of Slack's, and no account of
// what the conversation holds.
func TestDeliver_LookupAnsweredWithoutMessages(t *testing.T) {
	t.Parallel()
	for _, thread := range []bool{false, true} {
		t.Run(fmt.Sprintf("Thread=%t", thread), func(t *testing.T) {
			t.Parallel()
			b := setup(t, slack.Config{})
			d := messageOrReply(t, b, "k", thread)
			b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
			_, err := b.c.Deliver(t.Context(), d)
			require.True(t, connectors.IsAmbiguous(err), "%v", err)

			b.f.PlanLookup(slacktest.Plan{Body: `{"ok":true}`})
			d.Attempt, d.PreviousAmbiguous = 2, true
			raw, err := b.c.Deliver(t.Context(), d)
			require.Error(t, err, "stored %s", raw)
			require.Contains(t, err.Error(), `without "messages"`)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.False(t, connectors.IsAmbiguous(err), "a lookup acts on nothing: %v", err)
			require.Equal(t, 1, b.f.Effects("k"), "posted again after a lookup that read nothing")
		})
	}
}
