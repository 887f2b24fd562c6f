package ops_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// CopyOf and LatestCopy find the copies replay --new-key made, for keys of every
// length: a long key's copy has a readable part cut at 80 characters, with no
// "/replay/" left in it, and CopyOf looks up only keys that outbox.Key could have made
// for a copy.
func TestCopyLookups(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := t.Context()
	for _, key := range []string{"short/key", strings.Repeat("long-", 40), outbox.Key("run-1", "step")} {
		insertRow(t, pool, row{Key: key, Status: outbox.StatusDead, Attempts: 3, Age: time.Hour})
		latest, err := ops.LatestCopy(ctx, pool, key)
		require.NoError(t, err)
		require.Empty(t, latest)

		res, err := ops.Replay(ctx, pool, ops.Selection{Keys: []string{key}}, ops.ReplayOptions{Actor: "op", NewKey: true, Now: base})
		require.NoError(t, err)
		cp := res.NewKeys[key]
		require.NotEmpty(t, cp, "%+v", res)

		of, err := ops.CopyOf(ctx, pool, cp)
		require.NoError(t, err)
		require.Equal(t, key, of)
		of, err = ops.CopyOf(ctx, pool, key)
		require.NoError(t, err)
		require.Empty(t, of)
		latest, err = ops.LatestCopy(ctx, pool, key)
		require.NoError(t, err)
		require.Equal(t, cp, latest)
	}
}
