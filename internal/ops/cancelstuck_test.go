package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Cancel refuses a delivering row. When its lease has expired, no relay is delivering
// it: its relay stopped or lost the database mid-attempt (all relays may be down). The
// refusal must not tell the operator that relay is sending it now, but what happened and
// what leads somewhere.
func TestCancelOfAStuckRowSaysItIsStuck(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "live", Status: outbox.StatusDelivering, LeaseIn: time.Minute, LeaseOwner: "relay-a"})
	insertRow(t, pool, row{Key: "stuck", Status: outbox.StatusDelivering, LeaseIn: -time.Hour, LeaseOwner: "relay-gone", Attempts: 1})

	res, err := ops.Cancel(t.Context(), pool, []string{"live", "stuck"}, "op", "order refunded", base)
	require.NoError(t, err)
	require.Empty(t, res.Canceled)
	require.Contains(t, res.Refused["live"], "relay relay-a is delivering it")
	require.NotContains(t, res.Refused["stuck"], "is delivering it", "its relay's lease ran out an hour ago")
	require.Contains(t, res.Refused["stuck"], "lease expired")
	require.Contains(t, res.Refused["stuck"], "replay")
	require.Equal(t, outbox.StatusDelivering, state(t, pool, "stuck").Status)
}
