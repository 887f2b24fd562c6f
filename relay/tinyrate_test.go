package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/receiver"
)

// A rate so small that its next token is centuries away (one request per 30,000
// years) still says when to look again as a wait that far off: the wait overflowed its
// conversion to a time.Duration, came out negative, and was raised to a millisecond, so
// the claim loop turned every millisecond, claiming for every other instance each time
// (a round trip to the database a millisecond on an idle relay).
func TestTinyRateWaitsForItsNextToken(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook":       {Connector: guaranteed{connectors.Enforced}, Rate: 1e-12},
		"webhook:other": {Connector: guaranteed{connectors.Enforced}},
	})
	require.NoError(t, err)
	enqueue(t, b.pool, "tiny-0", "webhook", []int{0})
	enqueue(t, b.pool, "tiny-1", "webhook", []int{1})
	require.Equal(t, 1, claimOnce(t, r), "the burst of one")
	r.instances["webhook"].unsent.Add(-1) // as its request goes
	r.instances["webhook"].limiter.AllowN(r.cfg.NowFunc(), 1)

	_, _, _, retryIn, err := r.claimRound(t.Context(), nil, false)
	require.NoError(t, err)
	require.GreaterOrEqual(t, retryIn, time.Hour, "the next token is centuries away")
}
