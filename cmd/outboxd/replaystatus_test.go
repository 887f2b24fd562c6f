package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// outboxd replay --status dead --redeliver plans with a dry run, then replays the keys
// the plan would replay. A dead row whose last attempt's lease expired (ambiguous)
// accepts that attempt's late delivery (relay/sql.go, recordSQL); delivered between the
// plan and the run (while the operator reads the prompt, or between the batches of a
// paced replay), the run put the delivered row back and it was sent again, though the
// operator selected dead rows and was told nothing about redelivering it. The late
// delivery is injected right after the run looks its keys up.
func TestReplayByStatusDoesNotRedeliverWhatWasDeliveredSinceThePlan(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "late", Status: outbox.StatusDead, Attempts: 3, Ambiguous: true,
		LastError: "relay r1 lost its lease during attempt 3; that was the last allowed attempt"})

	var hookErr error
	hook := pgtest.After("SELECT id, idempotency_key FROM outbox WHERE idempotency_key = ANY($1)", func() {
		_, hookErr = d.pool.Exec(context.WithoutCancel(t.Context()), `
UPDATE outbox SET status = 'delivered', result = '{"status": 200}', ambiguous = false,
       delivered_at = now(), updated_at = now()
WHERE idempotency_key = 'late' AND status = 'dead' AND ambiguous AND attempts = 3`)
	})
	hook.Arm()
	pool := pgtest.PoolWith(t, d.pool, hook)

	var out, errb bytes.Buffer
	e := &env{environ: d.environ, stdin: strings.NewReader(""), stdout: &out, stderr: &errb}
	sel := ops.Selection{Filter: &ops.Filter{Status: []string{outbox.StatusDead}}}
	o := ops.ReplayOptions{Actor: "alice", Redeliver: true}
	err := replay(t.Context(), e, pool, sel, o, replayRun{yes: true, dsn: d.dsn})
	require.NoError(t, hookErr)
	require.True(t, hook.Ran(), "the late delivery was injected")
	t.Logf("err=%v\n%s%s", err, out.String(), errb.String())
	require.Equal(t, outbox.StatusDelivered, d.status(t, "late"),
		"a row delivered after the plan of --status dead was put back to be sent again:\n%s", out.String())
}
