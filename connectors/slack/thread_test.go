package slack_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/internal/slacktest"
)

// A payload's thread_ts may name a reply rather than the thread's parent (Slack advises
// against it, but takes it): Slack posts in the parent's thread, while
// conversations.replies given the reply's ts answers with that reply alone. The retry
// read that one message, took the thread for read to its end without the key, and
// posted a second reply.
func TestDeliver_ThreadTSNamingAReply(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	threadTS, reply := startThread(t, b)
	first, err := b.c.Deliver(t.Context(), reply("first-reply"))
	require.NoError(t, err)
	replyTS := decodeResult(t, first).TS

	d := delivery("k")
	d.Payload = json.RawMessage(fmt.Sprintf(`{"channel":"C0TEST","text":"reply to a reply","thread_ts":%q}`, replyTS))
	b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
	_, err = b.c.Deliver(t.Context(), d)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	msgs := b.f.Messages(testChannel)
	require.Equal(t, threadTS, msgs[len(msgs)-1].ThreadTS, "posted in the parent's thread")

	retryReconciles(t, b, d)
	require.Equal(t, 1, b.f.Posts("k"))
}

// A reply whose parent was deleted (with no replies left, so nothing stands for it) is
// posted by Slack as a message of the channel's own, without an error (see slack-go's
// PostMessageWithResponseContext). After an ambiguous attempt, the retry read the
// thread, met thread_not_found and sent the row to dead as refused, though the message
// had been posted: it is found in the channel's history, and the row delivered.
func TestDeliver_ReplyUnthreadedParentDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	threadTS, reply := startThread(t, b)
	b.f.Delete(testChannel, threadTS)

	b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
	_, err := b.c.Deliver(t.Context(), reply("k"))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	msgs := b.f.Messages(testChannel)
	require.Empty(t, msgs[len(msgs)-1].ThreadTS, "posted in the channel, not in a thread")

	d := reply("k")
	d.Attempt, d.PreviousAmbiguous = 2, true
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.Equal(t, result{Channel: testChannel, TS: msgs[len(msgs)-1].TS, Reconciled: true}, decodeResult(t, raw))
	require.Equal(t, 1, b.f.Effects("k"))

	// Nothing posted under the key: the thread is gone, and the retry says so without
	// posting, as before.
	b.f.Plan("n", slacktest.Plan{Status: http.StatusServiceUnavailable})
	_, err = b.c.Deliver(t.Context(), reply("n"))
	require.Error(t, err)
	d = reply("n")
	d.Attempt = 2
	_, err = b.c.Deliver(t.Context(), d)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "thread_not_found")
	require.Zero(t, b.f.Effects("n"))
}

// Slack answers "ok" to a post whose thread_ts is not written as its ts are (ten digits,
// a dot, six digits), such as a float's digits with the trailing zeros dropped
// ("1602251441.0017" for "1602251441.001700"), and the reply is then seen in no thread
// and not in the channel (slackapi/node-slack-sdk#780, slackapi/python-slack-sdk#840):
// the row was stored as delivered though nobody could see the message. Such a payload is
// refused before the row is written, and never posted.
func TestValidatePayload_ThreadTSMustBeAMessageTS(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	payload := func(ts string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"channel":"C0TEST","text":"reply","thread_ts":%q}`, ts))
	}
	require.NoError(t, slack.ValidatePayload(payload("1602251441.001700")))
	for _, ts := range []string{"1602251441.0017", "1602251441", "1602251441.", "1.2", "abc", " 1602251441.001700", "1602251441.001700\n"} {
		t.Run(ts, func(t *testing.T) {
			t.Parallel()
			require.ErrorContains(t, slack.ValidatePayload(payload(ts)), `"thread_ts"`)
			d := delivery("bad-thread-ts-" + ts)
			d.Payload = payload(ts)
			_, err := b.c.Deliver(t.Context(), d)
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.ErrorContains(t, err, `"thread_ts"`)
			require.Zero(t, b.f.Posts(d.Key))
		})
	}
}
