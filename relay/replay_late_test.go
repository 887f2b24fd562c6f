package relay

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// A relay loses the database mid-attempt; its lease runs out and another relay's reclaim
// puts the row away (held for an operator, or dead on its last attempt). An operator
// replays it. Then the first relay's outcome arrives, and it is not a delivery: the
// receiver did not take the request, or the relay still cannot tell. That answer is no
// news the operator lacked, and it must not undo the replay (held or dead again, the
// row never sent; or, after a replay under a new key, the old row sent again beside its
// copy); only a delivery, which says the receiver acted, overrides it.
func TestLateFailureDoesNotUndoAReplay(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		hold    bool
		maxAtt  int
		reclaim string
		newKey  bool   // replay --new-key: the row stays held, and a copy goes
		want    string // the row's status after the late outcome
		err     error
	}{
		{name: "held row, the late attempt ambiguous too", hold: true, maxAtt: 5, reclaim: outbox.StatusHeld,
			want: outbox.StatusPending, err: connectors.Ambiguous(errors.New("timeout after the request was written"))},
		{name: "row dead on its last attempt, the late attempt a 503", maxAtt: 1, reclaim: outbox.StatusDead,
			want: outbox.StatusPending, err: errors.New("503 Service Unavailable")},
		// Taken as a retry, the old row went back to pending and out again, beside its copy.
		{name: "held row replayed under a new key, the late attempt a 503", hold: true, maxAtt: 5, reclaim: outbox.StatusHeld,
			newKey: true, want: outbox.StatusHeld, err: errors.New("503 Service Unavailable")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, clock, sender, other, row := leaseLostAndReclaimed(t, tc.hold, tc.maxAtt, tc.reclaim)

			res, err := ops.Replay(t.Context(), b.pool, ops.Selection{Keys: []string{"late"}},
				ops.ReplayOptions{Actor: "op", Reason: "checked the receiver", NewKey: tc.newKey, Now: clock.Now()})
			require.NoError(t, err)
			require.Equal(t, []string{"late"}, res.Replayed)
			o := sender.decide(sender.instances["webhook"], row, nil, tc.err, clock.Now())
			o.started = row.claimedAt
			sender.writeOutcomes(t.Context(), []outcome{o})

			in, err := outbox.Get(t.Context(), b.pool, "late")
			require.NoError(t, err)
			require.Equal(t, tc.want, in.Status, "the operator's replay was undone by the late %s outcome: %s", o.status, in.LastError)
			want := []string{"late"}
			if tc.newKey {
				want = []string{res.NewKeys["late"]}
			}
			require.Equal(t, want, claimedKeys(claimRows(t, other, "webhook")), "the replayed row is sent, once")
			att := attemptsOf(t, b.pool, "late")
			require.Equal(t, o.record, att[len(att)-1].Outcome, "the late attempt is logged all the same")
		})
	}
}
