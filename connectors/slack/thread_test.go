package slack_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/slack"
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
	b.f.Plan("k", fakePlan{DropAfterEffect: true})
	_, err = b.c.Deliver(t.Context(), d)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	msgs := b.f.Messages(testChannel)
	require.Equal(t, threadTS, msgs[len(msgs)-1].ThreadTS, "posted in the parent's thread")

	d.Attempt, d.PreviousAmbiguous = 2, true
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.True(t, decodeResult(t, raw).Reconciled, "%s", raw)
	require.Equal(t, 1, b.f.Effects("k"), "the retry posted a second reply")
	require.Equal(t, 1, b.f.Posts("k"))
}
