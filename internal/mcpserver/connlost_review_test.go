package mcpserver_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/mcpserver"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// A session lost after the database committed the proposal but before its answer came
// back (a proxy or pooler restarted, a failover that resets connections) is the database
// out of reach, as one that is down; but the intent was written: the tool error must not
// tell the agent that nothing was, which it may take as the effect not happening.
// So in every query exec mode: behind a transaction pooler (simple protocol), pgx
// reports the lost session of the statement it sent as "conn closed"
// (pgconn.ErrConnClosed), which it calls safe to retry.
func TestMCPSessionLostAfterCommitDoesNotSayNothingWasWritten(t *testing.T) {
	t.Parallel()
	for _, mode := range append([]pgx.QueryExecMode{pgx.QueryExecModeCacheStatement}, pgtest.ExecModes...) {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			testMCPSessionLostAfterCommit(t, mode)
		})
	}
}

func testMCPSessionLostAfterCommit(t *testing.T, mode pgx.QueryExecMode) {
	direct := pgtest.DB(t)
	path := pgtest.NewPath(t, direct)
	pool := path.Pool(t, direct, pgtest.OneUnpingedSession, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = mode
	})
	b := &testBundle{pool: pool, svc: &intent.Service{Pool: pool, Policy: testPolicy()}}
	cs := b.connect(t, "agent")
	// The pool holds a session through the path that has prepared the proposal's
	// statement, so the next proposal is one round trip.
	ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "webhook", "key": "warm-1", "payload": map[string]any{},
	}))

	path.DropReplies(true) // the database's answers go no further
	res := make(chan string, 1)
	go func() {
		r, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: mcpserver.ToolPropose, Arguments: map[string]any{
			"connector": "webhook", "key": "lost-1", "payload": map[string]any{},
		}})
		if err != nil {
			res <- err.Error()
			return
		}
		res <- text(r)
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, direct.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE idempotency_key = 'lost-1'`).Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the proposal commits")
	path.Cut(true)

	msg := <-res
	require.Contains(t, msg, "database is unavailable")
	require.NotContains(t, msg, "nothing was written")
	require.Contains(t, msg, "may or may not have been written", "the agent hears that the intent may be there")
	require.Contains(t, msg, `same key "lost-1"`)
}
