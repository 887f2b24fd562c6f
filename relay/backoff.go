package relay

import (
	"time"

	"github.com/sethvargo/go-retry"
)

// jitterPercent spreads retries of rows that failed together, so they do not return
// together.
const jitterPercent = 20

// backoff returns the delay before the attempt after attempt number attempt (1-based):
// base doubled per attempt, ±20% jitter, capped at max. It is a pure function of its
// arguments but for the jitter; go-retry's backoffs are stateful, so a fresh one is built
// for every computation.
func backoff(attempt int, base, max time.Duration) time.Duration {
	b := retry.WithCappedDuration(max, retry.WithJitterPercent(jitterPercent, retry.NewExponential(base)))
	// Stop stepping once the uncapped value passes max: later steps only repeat the cap,
	// and shifting further would overflow.
	steps := 1
	for d := base; steps < attempt && d < max; d <<= 1 {
		steps++
	}
	var d time.Duration
	for range steps {
		d, _ = b.Next()
	}
	return d
}

// nextAttemptAt is when a row that just failed may be tried again: the receiver's delay
// when it named one (Retry-After wins), else the backoff for this attempt.
func nextAttemptAt(now time.Time, attempt int, receiverDelay time.Duration, hasDelay bool, base, max time.Duration) time.Time {
	if hasDelay {
		return now.Add(max0(receiverDelay))
	}
	return now.Add(backoff(attempt, base, max))
}

func max0(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	return d
}
