package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Two dead rows of one ordering key, re-executed by replay --new-key: their copies go
// to the end of the key, and must go out in the order of the rows they copy. A filter
// selects rows newest first, and keys come in the order the operator typed them; the
// copies were enqueued in that order, so the later row's copy went out first.
func TestReplayNewKeyCopiesKeepTheirOrderingKeysOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sel  ops.Selection
	}{
		{"Filter", ops.Selection{Filter: &ops.Filter{Status: []string{outbox.StatusDead}, OrderingKey: "cust-1"}}},
		{"KeysInReverse", ops.Selection{Keys: []string{"step-3", "step-1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			insertRow(t, pool, row{Key: "step-1", Status: outbox.StatusDead, Attempts: 1, OrderingKey: "cust-1", Age: 3 * time.Hour})
			insertRow(t, pool, row{Key: "step-2", Status: outbox.StatusDelivered, Attempts: 1, OrderingKey: "cust-1", Age: 2 * time.Hour})
			insertRow(t, pool, row{Key: "step-3", Status: outbox.StatusDead, Attempts: 1, OrderingKey: "cust-1", Age: time.Hour})

			res, err := ops.Replay(t.Context(), pool, tc.sel, ops.ReplayOptions{Actor: "op", NewKey: true, Now: base})
			require.NoError(t, err)
			require.ElementsMatch(t, []string{"step-1", "step-3"}, res.Replayed)
			first, err := outbox.Get(t.Context(), pool, res.NewKeys["step-1"])
			require.NoError(t, err)
			third, err := outbox.Get(t.Context(), pool, res.NewKeys["step-3"])
			require.NoError(t, err)
			require.Less(t, first.ID, third.ID, "the copy of step-3 goes out before the copy of step-1 in ordering key cust-1")
		})
	}
}
