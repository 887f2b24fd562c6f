package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// The operator's writes work on a pool in every query exec mode: their audit details
// went as [][]byte, which the simple protocol (a transaction pooler's usual setting)
// sends as bytea, and PostgreSQL refused them as jsonb.
func TestOperatorWritesInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.InMode(t, pgtest.DB(t), mode)
			insertRow(t, pool, row{Key: "pending", Status: outbox.StatusPending})
			insertRow(t, pool, row{Key: "waiting", Status: outbox.StatusAwaitingApproval})
			insertRow(t, pool, row{Key: "dead", Status: outbox.StatusDead, Attempts: 1})

			res, err := ops.Cancel(t.Context(), pool, []string{"pending"}, "alice", "no longer needed", base)
			require.NoError(t, err)
			require.Equal(t, []string{"pending"}, res.Canceled)
			_, err = ops.Approve(t.Context(), pool, "waiting", "alice", "", base)
			require.NoError(t, err)
			rep, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"dead"}}, ops.ReplayOptions{Actor: "alice"})
			require.NoError(t, err)
			require.Equal(t, []string{"dead"}, rep.Replayed)
			require.Len(t, auditRows(t, pool, "pending"), 1)
			require.Len(t, auditRows(t, pool, "waiting"), 1)
			require.Len(t, auditRows(t, pool, "dead"), 1)

			// Batches of one, so that each starts after the previous one's last row.
			insertRow(t, pool, row{Key: "sent-1", Status: outbox.StatusDelivered, Age: 48 * time.Hour})
			insertRow(t, pool, row{Key: "sent-2", Status: outbox.StatusDelivered, Age: 48 * time.Hour})
			pr, err := ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true, BatchSize: 1, Now: base})
			require.NoError(t, err)
			require.Equal(t, 2, pr.Rows)
			require.Len(t, auditRows(t, pool, "sent-2"), 1)
		})
	}
}

// The operator's reads work on a pool in every query exec mode too: in the simple
// protocol each $1 is written into the statement as an untyped literal, and status's
// "$1 - interval '1 hour'" took the time for an interval, so status failed on every
// database behind a transaction pooler ("invalid input syntax for type interval").
func TestOperatorReadsInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.InMode(t, pgtest.DB(t), mode)
			insertRow(t, pool, row{Key: "pending", Status: outbox.StatusPending})
			insertRow(t, pool, row{Key: "dead", Status: outbox.StatusDead, Attempts: 1})

			rep, err := ops.Status(t.Context(), pool, base)
			require.NoError(t, err)
			require.NotEmpty(t, rep.Connectors)
			page, err := ops.List(t.Context(), pool, ops.Filter{OlderThan: time.Minute, Now: base.Add(time.Hour), Status: []string{outbox.StatusDead}})
			require.NoError(t, err)
			require.Len(t, page.Intents, 1)
			_, err = ops.Inspect(t.Context(), pool, "dead")
			require.NoError(t, err)
		})
	}
}
