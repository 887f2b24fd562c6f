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

// The ambiguous attempt's message was pushed off the first page of history by others'
// messages before the retry: the retry reads on, finds it, and does not post again.
func TestDeliver_ReconcilesBeyondFirstHistoryPage(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{HistoryLimit: 3})
	b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)

	for i := range 5 {
		b.f.Seed(testChannel, fmt.Sprintf("chatter %d", i))
	}
	d := delivery("k")
	retryReconciles(t, b, d)
	require.Equal(t, 1, b.f.Posts("k"))
}

// When the lookup cannot read back far enough to know (the conversation had more
// messages since than it reads), the retry does not post blindly: it says so.
func TestDeliver_InconclusiveHistoryIsReportedNotReposted(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{HistoryLimit: 1})
	b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)

	for i := range 12 { // more than 10 pages of 1
		b.f.Seed(testChannel, fmt.Sprintf("chatter %d", i))
	}
	d := delivery("k")
	d.Attempt, d.PreviousAmbiguous = 2, true
	_, err = b.c.Deliver(t.Context(), d)
	require.Error(t, err, "the retry posted although it could not tell whether the earlier attempt had")
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Equal(t, 1, b.f.Effects("k"))
	require.Equal(t, 1, b.f.Posts("k"))
}

// A thread reply beyond the replies the lookup reads is not reposted blindly either.
func TestDeliver_InconclusiveThreadIsReportedNotReposted(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{HistoryLimit: 1})
	_, reply := startThread(t, b)
	for i := range 10 { // the parent and 10 replies fill more than the 10 pages of 1 the lookup reads
		_, err := b.c.Deliver(t.Context(), reply(fmt.Sprintf("earlier-%d", i)))
		require.NoError(t, err)
	}
	b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
	_, err := b.c.Deliver(t.Context(), reply("k"))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)

	d := reply("k")
	d.Attempt, d.PreviousAmbiguous = 2, true
	_, err = b.c.Deliver(t.Context(), d)
	require.Error(t, err, "the retry posted although it could not tell whether the earlier attempt had")
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Equal(t, 1, b.f.Effects("k"), "the retry posted a second reply")
	require.Equal(t, 1, b.f.Posts("k"))
}

// A library caller that does not set FirstAttemptAt (zero: unknown): a retry after a
// refused first attempt (nothing posted) in a conversation longer than 10 pages.
func TestZeroFirstAttemptAt(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{HistoryLimit: 1})
	for i := range 12 {
		b.f.Seed(testChannel, fmt.Sprintf("old chatter %d", i))
	}
	b.f.Plan("n", slacktest.Plan{Status: http.StatusServiceUnavailable})
	d := delivery("n")
	_, err := b.c.Deliver(t.Context(), d)
	require.Error(t, err)
	d.Attempt = 2
	_, err = b.c.Deliver(t.Context(), d)
	t.Logf("retry: %v", err)
	require.Error(t, err)
	require.True(t, connectors.IsPermanent(err))
	require.Contains(t, err.Error(), "first attempt is unknown")
}

// Slack may return fewer messages a page than the limit asks (at most 15 for apps outside
// its Marketplace): an inconclusive lookup says how many it read, not how many it asked for.
func TestDeliver_InconclusiveCountsMessagesRead(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{HistoryLimit: 100})
	b.f.CapLimit(2)
	b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	for i := range 25 {
		b.f.Seed(testChannel, fmt.Sprintf("chatter %d", i))
	}
	d := delivery("k")
	d.Attempt, d.PreviousAmbiguous = 2, true
	_, err = b.c.Deliver(t.Context(), d)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "not in the 20 messages read (10 pages, 100 asked for each)")
	require.Equal(t, 1, b.f.Posts("k"))
}

// A cursor Slack handed out a page earlier that it no longer takes (invalid_cursor:
// "not valid or is no longer valid") is no fault of the row: the next attempt reads from
// the first page with new cursors. It sent the row to dead as a refused request.
func TestDeliver_LookupCursorNoLongerValid(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{HistoryLimit: 1})
	b.f.Plan("k", slacktest.Plan{Status: http.StatusServiceUnavailable})
	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	for i := range 3 {
		b.f.Seed(testChannel, fmt.Sprintf("chatter %d", i))
	}

	b.f.PlanLookup(slacktest.Plan{}, slacktest.Plan{Error: "invalid_cursor"})
	d := delivery("k")
	d.Attempt = 2
	_, err = b.c.Deliver(t.Context(), d)
	require.Error(t, err)
	require.Contains(t, err.Error(), "invalid_cursor")
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.False(t, connectors.IsAmbiguous(err), "%v", err)
	require.Equal(t, 1, b.f.Posts("k"), "the refused first attempt's post only: none without a successful lookup")

	d.Attempt = 3
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.False(t, decodeResult(t, raw).Reconciled, "%s", raw)
	require.Equal(t, 1, b.f.Effects("k"))
}
