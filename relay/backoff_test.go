package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	base, capped := time.Second, time.Minute
	for attempt, want := range map[int]time.Duration{
		1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 6: 32 * time.Second,
	} {
		seen := map[time.Duration]bool{}
		for range 50 {
			d := backoff(attempt, base, capped)
			require.GreaterOrEqual(t, d, want*80/100, "attempt %d", attempt)
			require.LessOrEqual(t, d, want*120/100, "attempt %d", attempt)
			seen[d] = true
		}
		// Jittered, so rows that failed together do not come back together; fifty draws
		// from a spread of nanoseconds never all come out alike by chance.
		require.Greater(t, len(seen), 1, "attempt %d: the delays vary", attempt)
	}
	for _, attempt := range []int{7, 10, 64, 1000} {
		// At the cap too, rows that failed together do not come back together: capped
		// after the jitter, most delays (82% at attempts 13-25 with the defaults) were
		// the cap itself.
		atCap := 0
		for range 50 {
			d := backoff(attempt, base, capped)
			require.LessOrEqual(t, d, capped, "capped at attempt %d", attempt)
			require.GreaterOrEqual(t, d, capped*80/100, "attempt %d", attempt)
			if d == capped {
				atCap++
			}
		}
		require.Less(t, atCap, 10, "attempt %d: delays at the cap are spread below it", attempt)
	}
}

func TestNextAttemptAtRetryAfterWins(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	require.Equal(t, now.Add(90*time.Second), nextAttemptAt(now, 1, 90*time.Second, true, time.Second, time.Minute),
		"Retry-After wins even over the cap")
	require.WithinRange(t, nextAttemptAt(now, 3, -time.Second, true, time.Second, time.Minute),
		now.Add(3200*time.Millisecond), now.Add(4800*time.Millisecond), "a date in the past names no wait: the backoff applies")
	require.WithinRange(t, nextAttemptAt(now, 3, 0, true, time.Second, time.Minute),
		now.Add(3200*time.Millisecond), now.Add(4800*time.Millisecond), "nor does Retry-After: 0")
	got := nextAttemptAt(now, 2, 0, false, time.Second, time.Minute)
	require.WithinRange(t, got, now.Add(1600*time.Millisecond), now.Add(2400*time.Millisecond))
}
