package mcpserver_test

import (
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// After outboxd replay --new-key, the operation of a dead intent continues under a new
// key, and the intent itself stays dead. get_intent told the agent it was dead and that
// "an operator may replay it", for good: an agent takes that for a failed operation, and
// acts again or reports a failure for an effect that happened. It must name the copy
// and its status, and the copy must name the key it copies. list_intents and the same
// decision proposed again answer the intent too, and must name the same (agreeMCP): they
// named neither, so an agent that listed its intents, or proposed again as the key
// allows, read the operation as failed and may have acted again.
func TestReadsNameTheCopyAReplayWithANewKeyMade(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	ctx := t.Context()
	cs := b.connect(t, "agent")
	key := outbox.Key("run-3", "charge", "cust-7")
	ok[map[string]any](t, call(t, cs, "propose_intent", map[string]any{
		"connector": "webhook", "key": key, "payload": map[string]any{"amount": 5},
	}))
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET status = 'dead', attempts = 5, last_error = 'receiver answered 500'
		WHERE idempotency_key = $1`, key)
	require.NoError(t, err)
	res, err := ops.Replay(ctx, b.pool, ops.Selection{Keys: []string{key}}, ops.ReplayOptions{Actor: "op", NewKey: true})
	require.NoError(t, err)
	cp := res.NewKeys[key]
	require.NotEmpty(t, cp, "%+v", res)
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = 'delivered', delivered_at = now() WHERE idempotency_key = $1`, cp)
	require.NoError(t, err)

	got := call(t, cs, "get_intent", map[string]any{"key": key})
	out := ok[map[string]any](t, got)
	require.Equal(t, map[string]any{"key": cp, "status": "delivered"}, out["replayed_as"], text(got))
	again := agreeMCP(t, cs, out)
	require.Contains(t, again["message"], cp, "the agent proposing again is told where the operation went")
	require.NotContains(t, again["message"], "an operator may replay it")
	msg := out["message"].(string)
	require.Contains(t, msg, cp)
	require.Contains(t, msg, "delivered")
	require.NotContains(t, msg, "an operator may replay it", "the operator did")
	require.Contains(t, text(got), cp)

	got = call(t, cs, "get_intent", map[string]any{"key": cp})
	out = ok[map[string]any](t, got)
	require.Equal(t, key, out["copy_of"], text(got))
	agreeMCP(t, cs, out)
	require.Contains(t, out["message"].(string), key)

	// A token that may not use the connector learns nothing of either.
	mailer := b.connect(t, "mailer")
	require.Contains(t, toolErr(t, call(t, mailer, "get_intent", map[string]any{"key": key})), "not found")
	require.Contains(t, toolErr(t, call(t, mailer, "get_intent", map[string]any{"key": cp})), "not found")
}

// outboxd mcp needs only SELECT, INSERT on outbox (README). Naming the copies reads
// outbox_audit, which such a role may not: get_intent must still answer, and say that
// it cannot tell whether an operator re-executed the intent under a new key.
func TestGetIntentWithoutTheAuditTrailStillAnswers(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	ctx := t.Context()
	rolePool := pgtest.PoolAs(t, b.pool, pgtest.Role(t, b.pool, "outboxd_mcp_", `GRANT SELECT, INSERT ON outbox TO ROLE_`))
	svc := &intent.Service{Pool: rolePool, Policy: testPolicy()}
	cs := connectAs(t, svc, &svc.Policy.Tokens[0], nil)
	key := outbox.Key("run-4", "notify")
	ok[map[string]any](t, call(t, cs, "propose_intent", map[string]any{
		"connector": "webhook", "key": key, "payload": map[string]any{"n": 1},
	}))
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET status = 'dead' WHERE idempotency_key = $1`, key)
	require.NoError(t, err)
	res, err := ops.Replay(ctx, b.pool, ops.Selection{Keys: []string{key}}, ops.ReplayOptions{Actor: "op", NewKey: true})
	require.NoError(t, err)
	cp := res.NewKeys[key]
	require.NotEmpty(t, cp, "%+v", res)

	got := call(t, cs, "get_intent", map[string]any{"key": key})
	out := ok[map[string]any](t, got)
	require.Contains(t, out["message"].(string), "outbox_audit", text(got))
	require.NotContains(t, out, "replayed_as")
	got = call(t, cs, "get_intent", map[string]any{"key": cp})
	out = ok[map[string]any](t, got)
	require.Equal(t, "pending", out["intent"].(map[string]any)["status"], text(got))

	// Nor need it read outbox_attempts: an intent canceled after an attempt may have
	// happened, for all the role can tell.
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = 'canceled', attempts = 2 WHERE idempotency_key = $1`, cp)
	require.NoError(t, err)
	got = call(t, cs, "get_intent", map[string]any{"key": cp})
	out = ok[map[string]any](t, got)
	require.Contains(t, out["may_have_acted"].(map[string]any)["reason"], "outbox_attempts", text(got))
	require.NotContains(t, out["message"], "will not happen")
	// list_intents warns as get_intent does: its dead row reads as a failed operation.
	list := ok[map[string]any](t, call(t, cs, "list_intents", map[string]any{}))
	require.Len(t, list["intents"], 2)
	require.Contains(t, list["message"], "outbox_audit", list)
	list = ok[map[string]any](t, call(t, cs, "list_intents", map[string]any{"status": "pending"}))
	require.NotContains(t, list, "message", "no intent it lists could have been re-executed")
}

// agreeMCP requires the other answers of the intent in got, get_intent's output, to say
// what became of its operation as got does (its copies, whether a canceled one may have
// acted): its entry in list_intents, and propose_intent's output for the same decision
// proposed again under its key, which it returns.
func agreeMCP(t *testing.T, cs *mcp.ClientSession, got map[string]any) map[string]any {
	t.Helper()
	in := got["intent"].(map[string]any)
	list := ok[map[string]any](t, call(t, cs, "list_intents", map[string]any{"limit": 1000}))
	var listed map[string]any
	for _, l := range list["intents"].([]any) {
		if l.(map[string]any)["key"] == in["key"] {
			listed = l.(map[string]any)
		}
	}
	require.NotNil(t, listed, "%s is not listed: %v", in["key"], list)
	again := ok[map[string]any](t, call(t, cs, "propose_intent", map[string]any{
		"connector": in["connector"], "key": in["key"], "payload": in["payload"],
	}))
	require.Equal(t, true, again["replayed"])
	for _, field := range []string{"copy_of", "replayed_as", "may_have_acted"} {
		require.Equal(t, got[field], listed[field], "%s of %s listed: %v", field, in["key"], list)
		require.Equal(t, got[field], again[field], "%s of %s proposed again: %v", field, in["key"], again)
	}
	return again
}

// An intent canceled after an attempt that may have reached the receiver may have
// happened: the cancel stops further attempts, not what the receiver did. get_intent told
// the agent "It was canceled or rejected and will not happen", and list_intents and a
// proposal made again showed "canceled" alone. They name why it may have acted, as the
// intent API's cancel does; one canceled before any attempt will not happen.
func TestCanceledAfterAnAttemptMayHaveHappened(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	for _, key := range []string{"reached", "never-sent"} {
		ok[map[string]any](t, call(t, cs, "propose_intent", map[string]any{
			"connector": "webhook", "key": key, "payload": map[string]any{"n": 1},
		}))
	}
	// Reclaimed after its relay's lease expired mid-attempt: pending, marked ambiguous.
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET ambiguous = true, attempts = 1 WHERE idempotency_key = 'reached'`)
	require.NoError(t, err)
	res, err := ops.Cancel(t.Context(), b.pool, []string{"reached", "never-sent"}, "op", "order refunded", time.Time{})
	require.NoError(t, err)
	require.Contains(t, res.MayHaveActed, "reached")

	got := call(t, cs, "get_intent", map[string]any{"key": "reached"})
	out := ok[map[string]any](t, got)
	require.Equal(t, "canceled", out["intent"].(map[string]any)["status"])
	acted, isMap := out["may_have_acted"].(map[string]any)
	require.True(t, isMap, text(got))
	require.Equal(t, "webhook", acted["connector"])
	require.Contains(t, acted["reason"], "may have reached the receiver")
	msg := out["message"].(string)
	require.NotContains(t, msg, "will not happen")
	require.Contains(t, msg, "may have happened")
	again := agreeMCP(t, cs, out)
	require.NotContains(t, again["message"], "will not happen")

	got = call(t, cs, "get_intent", map[string]any{"key": "never-sent"})
	out = ok[map[string]any](t, got)
	require.NotContains(t, out, "may_have_acted")
	require.Contains(t, out["message"], "will not happen")
	agreeMCP(t, cs, out)
}

// A dead intent an attempt of which may have reached the receiver read as a failed
// operation: get_intent said the relay gave up, and named no may_have_acted. It now names
// it and says the effect may have happened, as for a canceled one; a dead intent whose
// attempts all failed plainly does not.
func TestDeadAfterAnAttemptMayHaveHappened(t *testing.T) {
	t.Parallel()
	b := setupService(t)
	cs := b.connect(t, "agent")
	for _, key := range []string{"reached", "refused"} {
		ok[map[string]any](t, call(t, cs, "propose_intent", map[string]any{
			"connector": "webhook", "key": key, "payload": map[string]any{"n": 1},
		}))
	}
	// The latest attempt marked ambiguous, then a reclaim's retry policy sent it to dead.
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead', attempts = 1,
		ambiguous = (idempotency_key = 'reached') WHERE idempotency_key IN ('reached', 'refused')`)
	require.NoError(t, err)

	got := call(t, cs, "get_intent", map[string]any{"key": "reached"})
	out := ok[map[string]any](t, got)
	acted, isMap := out["may_have_acted"].(map[string]any)
	require.True(t, isMap, text(got))
	require.Contains(t, acted["reason"], "dead after an attempt that may have reached the receiver")
	require.Contains(t, out["message"], "may have happened")
	agreeMCP(t, cs, out)

	got = call(t, cs, "get_intent", map[string]any{"key": "refused"})
	out = ok[map[string]any](t, got)
	require.NotContains(t, out, "may_have_acted")
	require.Contains(t, out["message"], "The relay gave up")
	agreeMCP(t, cs, out)
}
