package ops_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/replaylock"
	"github.com/outboxd/outboxd/outbox"
)

// A replay of rows with ordering keys waits a few seconds at most for the relays' claim
// rounds under way (internal/replaylock), then fails, to be run again. Its error said
// only "wait for claims under way: ERROR: canceling statement due to lock timeout",
// which tells an operator neither what held the replay nor whether running it again is
// safe; it now says both, and that the batch was left as it was.
func TestReplayThatGaveUpOnClaimRoundsSaysWhatToDo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "k-1", Status: outbox.StatusDead, Attempts: 1, OrderingKey: "cust-1", LastError: "answered 500"})
	round, err := pool.Begin(ctx) // a relay's claim round that stands still
	require.NoError(t, err)
	defer func() { _ = round.Rollback(context.WithoutCancel(ctx)) }()
	_, err = round.Exec(ctx, replaylock.ClaimSQL)
	require.NoError(t, err)

	res, err := ops.Replay(ctx, pool, ops.Selection{Keys: []string{"k-1"}}, ops.ReplayOptions{Actor: "op", Now: base})
	require.Error(t, err)
	require.Empty(t, res.Replayed)
	require.ErrorContains(t, err, "a relay's claim round")
	require.ErrorContains(t, err, "running the replay again is safe")
	require.Equal(t, outbox.StatusDead, state(t, pool, "k-1").Status, "nothing of the batch committed")
}
