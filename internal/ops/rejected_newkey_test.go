package ops_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// An intent an approver rejected (status canceled) must not be re-executed, without
// approval, by a bulk `replay --new-key` selected by filter, which an operator runs to
// re-execute dead rows: canceled rows are refused, with NewKey too.
func TestReplayNewKeyNeverCopiesARejectedIntent(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(t.Context(), tx, outbox.Message{Key: "refund-big", Connector: "webhook",
			Payload: []byte(`{"amount": 1000000}`), RequireApproval: true})
		return err
	})
	require.NoError(t, err)
	_, err = ops.Reject(t.Context(), pool, "refund-big", "approver", "fraud", base)
	require.NoError(t, err)

	res, err := ops.Replay(t.Context(), pool, ops.Selection{Filter: &ops.Filter{Connector: "webhook"}},
		ops.ReplayOptions{Actor: "op", NewKey: true, Now: base})
	require.NoError(t, err)
	for k, nk := range res.NewKeys {
		in, err := outbox.Get(t.Context(), pool, nk)
		require.NoError(t, err)
		t.Logf("%s -> copy %s status %s", k, nk, in.Status)
	}
	require.Empty(t, res.NewKeys, "a rejected intent was re-executed without approval: %+v", res)
	require.Contains(t, res.Refused["refund-big"], "canceled rows stay canceled")
}
