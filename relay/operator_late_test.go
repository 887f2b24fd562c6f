package relay

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A relay loses the database mid-attempt (the receiver acts); its lease runs out and
// another relay's reclaim puts the row away as ambiguous. An operator then acts on the
// row before the first relay's outcome arrives. That outcome is the truth (see
// TestLateOutcomeAfterLastAttemptWentDead, and replaySQL, which keeps a stuck row
// ambiguous for exactly this reason): it must still be recorded, not dropped because
// the operator's action cleared the row's ambiguous mark, after which the row is sent a
// second time (replay) or reads "canceled" although the receiver acted (cancel).
func TestLateOutcomeAfterAnOperatorActedOnAReclaimedRow(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		hold    bool   // forwarded connector with the hold policy
		maxAtt  int    // 1: reclaim sends the row to dead
		reclaim string // status reclaim leaves
		act     func(t *testing.T, b *testBundle, now time.Time)
	}{
		{name: "replay of a row reclaim sent to dead", maxAtt: 1, reclaim: outbox.StatusDead, act: replayIt},
		{name: "replay of a row reclaim held", hold: true, maxAtt: 5, reclaim: outbox.StatusHeld, act: replayIt},
		{name: "cancel of a row reclaim put back to pending", maxAtt: 5, reclaim: outbox.StatusPending,
			act: func(t *testing.T, b *testBundle, now time.Time) {
				res, err := ops.Cancel(t.Context(), b.pool, []string{"late"}, "op", "customer asked", now)
				require.NoError(t, err)
				require.Equal(t, []string{"late"}, res.Canceled)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, clock, sender, other, row := leaseLostAndReclaimed(t, tc.hold, tc.maxAtt, tc.reclaim)

			// The operator acts; then the sender's outcome (the receiver acted) arrives.
			tc.act(t, b, clock.Now())
			o := sender.decide(sender.instances["webhook"], row, json.RawMessage(`{"status":200}`), nil, clock.Now())
			o.started = row.claimedAt
			sender.writeOutcomes(t.Context(), []outcome{o})

			in, err := outbox.Get(t.Context(), b.pool, "late")
			require.NoError(t, err)
			require.Equal(t, outbox.StatusDelivered, in.Status,
				"the receiver acted and the relay said so, but the row is %s (result %s); a relay would send it again: %v",
				in.Status, in.Result, claimedKeys(claimRows(t, other, "webhook")))
			require.JSONEq(t, `{"status":200}`, string(in.Result))
		})
	}
}

func replayIt(t *testing.T, b *testBundle, now time.Time) {
	t.Helper()
	res, err := ops.Replay(t.Context(), b.pool, ops.Selection{Keys: []string{"late"}}, ops.ReplayOptions{Actor: "op", Reason: "receiver fixed", Now: now})
	require.NoError(t, err)
	require.Equal(t, []string{"late"}, res.Replayed)
}

// leaseLostAndReclaimed is where the late-outcome tests start: relay "sender" (the
// instance forwarded with the hold policy when hold) claims the row "late" with a lease
// of 10s, the lease expires, and relay "other" reclaims the row, which becomes status
// reclaim (with at most maxAtt attempts). Sender's outcome for row is yet to come.
func leaseLostAndReclaimed(t *testing.T, hold bool, maxAtt int, reclaim string) (b *testBundle, clock *testClock, sender, other *Relay, row claimed) {
	t.Helper()
	b = setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.MaxAttempts, cfg.Lease = maxAtt, 10*time.Second
	inst := map[string]Instance{"webhook": {Connector: b.hook}}
	if hold {
		hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
		require.NoError(t, err)
		inst = map[string]Instance{"webhook": {Connector: hook, OnAmbiguous: AmbiguousHold}}
	}
	newR := func(id string) *Relay {
		c := *cfg
		c.ID, c.Registerer = id, nil
		r, err := New(b.pool, &c, inst)
		require.NoError(t, err)
		return r
	}
	sender, other = newR("sender"), newR("other")
	enqueue(t, b.pool, "late", "webhook", []int{1})
	got := claimRows(t, sender, "webhook")
	require.Len(t, got, 1)

	clock.Advance(cfg.Lease + time.Second)
	other.reclaim(t.Context())
	in, err := outbox.Get(t.Context(), b.pool, "late")
	require.NoError(t, err)
	require.Equal(t, reclaim, in.Status)
	return b, clock, sender, other, got[0]
}

// A replay keeps the row's attempts (and its first attempt's time), as the README says:
// a row that went dead on MaxAttempts gets one more attempt, and a retryable failure of
// it makes the row dead again; a success delivers it.
func TestReplayedRowThatRanOutOfAttemptsGetsOneAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	b.receiver.Plan("tired", receiver.Plan{FailFirst: 3})
	cfg := b.fastConfig()
	cfg.MaxAttempts = 2
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	enqueue(t, b.pool, "tired", "webhook", []string{"tired"})
	require.Equal(t, 2, waitStatus(t, b.pool, "tired", outbox.StatusDead).Attempts)

	replay := func() {
		t.Helper()
		res, err := ops.Replay(t.Context(), b.pool, ops.Selection{Keys: []string{"tired"}}, ops.ReplayOptions{Actor: "op", Now: time.Now()})
		require.NoError(t, err)
		require.Equal(t, []string{"tired"}, res.Replayed)
	}
	replay()
	dead := waitStatus(t, b.pool, "tired", outbox.StatusDead)
	require.Equal(t, 3, dead.Attempts, "one attempt, which failed (the receiver's third 503)")
	require.Contains(t, dead.LastError, "gave up after 3 attempts")
	replay()
	require.Equal(t, 4, waitStatus(t, b.pool, "tired", outbox.StatusDelivered).Attempts)
	require.Equal(t, 1, b.receiver.Effects("tired"))
}
