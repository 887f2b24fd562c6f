package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// The row's ambiguous mark tells of its latest attempt only, and a plain failure clears
// it. A row whose first attempt reached the receiver, which acted, and lost the answer,
// and whose later attempts were refused before anything was sent (a 503), went dead
// with a last_error of the 503 alone: the API's GET, MCP's get_intent, list and inspect's
// summary showed a row the receiver never acted on, though it did. The dead row's
// last_error now names the earlier ambiguous attempt.
func TestDeadAfterAnEarlierAmbiguousAttemptSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.MaxAttempts = 2
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	b.receiver.Plan("acted", receiver.Plan{DropAfterEffect: 1})
	b.receiver.Plan("refused", receiver.Plan{FailFirst: 1000})
	enqueue(t, b.pool, "acted", "webhook", []int{1})
	enqueue(t, b.pool, "refused", "webhook", []int{2})

	for _, key := range []string{"acted", "refused"} {
		require.Eventually(t, func() bool { return len(attemptsOf(t, b.pool, key)) == 1 }, waitTimeout, 10*time.Millisecond)
	}
	require.True(t, attemptsOf(t, b.pool, "acted")[0].Ambiguous)
	b.receiver.Plan("acted", receiver.Plan{FailFirst: 1000}) // the retry is refused before anything is done
	clock.Advance(time.Hour)

	acted := waitStatus(t, b.pool, "acted", outbox.StatusDead)
	t.Logf("last_error=%q", acted.LastError)
	require.Equal(t, 1, b.receiver.Effects("acted"))
	require.Contains(t, acted.LastError, "503")
	require.Contains(t, acted.LastError, "gave up after 2 attempts")
	require.Contains(t, acted.LastError, "attempt 1 was ambiguous: the receiver may have acted then")
	att := attemptsOf(t, b.pool, "acted")
	require.Len(t, att, 2)
	require.NotContains(t, att[1].Error, "attempt 1", "the attempts log keeps each attempt's own error")

	refused := waitStatus(t, b.pool, "refused", outbox.StatusDead)
	require.Equal(t, 0, b.receiver.Effects("refused"))
	require.NotContains(t, refused.LastError, "ambiguous", "no attempt of it may have acted")
}
