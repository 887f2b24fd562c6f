package ops_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// replay --new-key leaves the dead row as it is, so the same command run again (the
// next day, for the rows that died since) selects it again. Once its copy was
// delivered, the operation has happened: a further copy would make the receiver act
// again, which for a delivered row needs Redeliver. So does a copy that is gone
// (retention and purge delete only delivered and canceled rows).
func TestReplayNewKeyDoesNotReExecuteADeliveredCopy(t *testing.T) {
	t.Parallel()
	pool, sel, opts, first := copiedDeadRow(t)
	_, err := pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', delivered_at = $2 WHERE idempotency_key = $1`,
		first, base)
	require.NoError(t, err)

	res, err := ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed, "the operation was executed again though its copy was delivered")
	require.Contains(t, res.Refused["charge"], first)
	require.Contains(t, res.Refused["charge"], "Redeliver")
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM outbox`))

	_, err = pool.Exec(t.Context(), `DELETE FROM outbox WHERE idempotency_key = $1`, first)
	require.NoError(t, err)
	res, err = ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed, "the operation was executed again though its copy was purged")
	require.Contains(t, res.Refused["charge"], "Redeliver")

	// Asked explicitly, it is executed once more.
	opts.Redeliver = true
	res, err = ops.Replay(t.Context(), pool, sel, opts)
	require.NoError(t, err)
	require.Equal(t, []string{"charge"}, res.Replayed)
	require.Equal(t, outbox.Key("charge", "replay", "2"), res.NewKeys["charge"])
}
