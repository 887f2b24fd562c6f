package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A row past its receiver's key window is refused under its own key, whatever its
// status, with what to do for that status; with NewKey it is copied; a row inside the
// window, or of an instance KeyWindowFunc gives none, is replayed.
func TestReplayPastTheKeyWindow(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	for _, r := range []row{
		{Key: "held", Connector: "payment", Status: outbox.StatusHeld, Attempts: 1},
		{Key: "dead", Connector: "payment", Status: outbox.StatusDead, Attempts: 1},
		{Key: "delivered", Connector: "payment", Status: outbox.StatusDelivered, Attempts: 1},
		{Key: "stuck", Connector: "payment", Status: outbox.StatusDelivering, LeaseIn: -time.Minute, Attempts: 1},
		{Key: "inside", Connector: "payment", Status: outbox.StatusDead, Attempts: 1},
		{Key: "webhook", Connector: "webhook", Status: outbox.StatusDead, Attempts: 1},
	} {
		if r.Connector == "payment" {
			r.Payload = `{"operation": "refund.create", "params": {"payment_intent": "pi_1"}}`
		}
		id := insertRow(t, pool, r)
		first := base.Add(-25 * time.Hour)
		if r.Key == "inside" {
			first = base.Add(-24*time.Hour + time.Minute) // an attempt of up to 20s ends inside
		}
		_, err := pool.Exec(t.Context(), `UPDATE outbox SET first_attempt_at = $2 WHERE id = $1`, id, first)
		require.NoError(t, err)
	}
	opts := replayOpts()
	opts.Redeliver = true
	opts.KeyWindowFunc = func(connector string) ops.KeyWindow {
		if connector == "payment" {
			return ops.KeyWindow{Window: 24 * time.Hour, AttemptMax: 20 * time.Second}
		}
		return ops.KeyWindow{}
	}
	keys := []string{"held", "dead", "delivered", "stuck", "inside", "webhook"}
	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: keys}, opts)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"inside", "webhook"}, res.Replayed)
	for key, todo := range map[string]string{
		"held":      "then replay it with NewKey (--new-key) to act, or cancel it",
		"dead":      "then replay it with NewKey (--new-key) to act",
		"delivered": "to send it again, replay it with NewKey and Redeliver (--new-key --redeliver)",
		"stuck":     "a relay with its connector will put it back and hold it",
	} {
		require.Contains(t, res.Refused[key], "past its key window: payment remembers idempotency keys for 24h0m0s "+
			"and the row's first attempt was at 2030-05-31T11:00:00Z, so a relay would hold it again without sending it", key)
		require.Contains(t, res.Refused[key], todo, key)
	}
	require.Equal(t, outbox.StatusHeld, state(t, pool, "held").Status)
	require.Equal(t, outbox.StatusDelivering, state(t, pool, "stuck").Status)
	require.Empty(t, auditRows(t, pool, "held"))

	// A copy has a key the receiver has not seen.
	opts.NewKey = true
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"held", "dead"}}, opts)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"held", "dead"}, res.Replayed, "%v", res.Refused)
}

// A row past its key window that replay --new-key re-executed is refused for what its
// copy did, not for its window: refused "past its key window ... replay it with NewKey
// to act", an operator who checked the receiver for the row's own key (which it never
// acted on) read an operation to act on, when its copy had been delivered. And a copy
// past its own window is told to have the row it copies re-executed with NewKey, which
// makes the next copy, not itself, which NewKey refuses.
func TestReplayPastTheKeyWindowNamesTheCopyFirst(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	payload := `{"operation": "refund.create", "params": {"payment_intent": "pi_1"}}`
	id := insertRow(t, pool, row{Key: "op", Connector: "payment", Status: outbox.StatusHeld, Attempts: 1, Payload: payload})
	_, err := pool.Exec(t.Context(), `UPDATE outbox SET first_attempt_at = $2 WHERE id = $1`, id, base.Add(-25*time.Hour))
	require.NoError(t, err)
	opts := replayOpts()
	opts.KeyWindowFunc = func(connector string) ops.KeyWindow {
		return ops.KeyWindow{Window: 24 * time.Hour, AttemptMax: 20 * time.Second}
	}
	withNewKey := opts
	withNewKey.NewKey = true
	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"op"}}, withNewKey)
	require.NoError(t, err)
	cp := res.NewKeys["op"]
	require.NotEmpty(t, cp, "%v", res.Refused)

	// The copy failed after an attempt of its own, 25 hours ago: past its own window.
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead', attempts = 1, first_attempt_at = $2
		WHERE idempotency_key = $1`, cp, base.Add(-25*time.Hour))
	require.NoError(t, err)
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"op", cp}}, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed)
	require.Contains(t, res.Refused["op"], "its copy "+cp+", which replay --new-key made, is dead: replay the copy instead")
	require.Contains(t, res.Refused[cp], "past its key window")
	require.Contains(t, res.Refused[cp], `then replay "op", the row this copy re-executes, with NewKey (--new-key) to act`)

	// Delivered, the copy is what the row is refused for.
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', delivered_at = $2 WHERE idempotency_key = $1`,
		cp, base.Add(-time.Hour))
	require.NoError(t, err)
	res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"op"}}, opts)
	require.NoError(t, err)
	require.Empty(t, res.Replayed)
	require.Contains(t, res.Refused["op"], "its copy "+cp+" was delivered")
	require.NotContains(t, res.Refused["op"], "past its key window")
}
