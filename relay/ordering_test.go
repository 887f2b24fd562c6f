package relay

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// enqueueOrdered enqueues a row of ordering key ok.
func enqueueOrdered(t *testing.T, db outbox.DB, key, ok string) outbox.Intent {
	t.Helper()
	in, err := outbox.Enqueue(t.Context(), db, outbox.Message{Key: key, Connector: "webhook", OrderingKey: ok, Payload: []int{1}})
	require.NoError(t, err)
	return in
}

func claimedKeys(rows []claimed) []string {
	out := []string{}
	for _, r := range rows {
		out = append(out, r.key)
	}
	return out
}

// A dead head no longer holds its key back, so the next row goes out. When an operator
// replays the head while that row is in flight, the head must wait: two rows of one key
// are never in flight at once.
func TestReplayedHeadWaitsForItsKeysRowInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	inst := r.instances["webhook"]
	enqueueOrdered(t, b.pool, "k-1", "k")
	enqueueOrdered(t, b.pool, "k-2", "k")

	got := claimRows(t, r, "webhook")
	require.Equal(t, []string{"k-1"}, claimedKeys(got))
	o := r.decide(inst, got[0], nil, connectors.Permanent(errors.New("422")), clock.Now())
	o.started = got[0].claimedAt
	r.writeOutcomes(t.Context(), []outcome{o})

	second := claimRows(t, r, "webhook")
	require.Equal(t, []string{"k-2"}, claimedKeys(second), "a dead head does not hold its key back")

	res, err := ops.Replay(t.Context(), b.pool, ops.Selection{Keys: []string{"k-1"}}, ops.ReplayOptions{Actor: "op", Now: clock.Now()})
	require.NoError(t, err)
	require.Equal(t, []string{"k-1"}, res.Replayed)

	require.Empty(t, claimedKeys(claimRows(t, r, "webhook")), "k-2 of the same key is still in flight")

	o = r.decide(inst, second[0], json.RawMessage(`{}`), nil, clock.Now())
	o.started = second[0].claimedAt
	r.writeOutcomes(t.Context(), []outcome{o})
	require.Equal(t, []string{"k-1"}, claimedKeys(claimRows(t, r, "webhook")))
}

// A relay's outcome that arrives after its lease ran out and another relay sent the row
// to dead because another attempt would be past its maximum age must not bring the row
// back to pending: it would be retried after its maximum age (and, with an ordering key,
// after the rows of its key that went on meanwhile).
func TestLateRetryDoesNotReviveARowPastItsMaxAge(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.MaxAge, cfg.Lease = time.Hour, 10*time.Second
	sender, other := b.namedRelay(t, cfg, "sender"), b.namedRelay(t, cfg, "other")
	enqueueOrdered(t, b.pool, "old-1", "k")
	enqueueOrdered(t, b.pool, "old-2", "k")
	got := claimRows(t, sender, "webhook")
	require.Equal(t, []string{"old-1"}, claimedKeys(got))
	row := got[0]
	// The attempt fails at once; its retry is well inside the maximum age...
	o := sender.decide(sender.instances["webhook"], row, nil, errors.New("503 Service Unavailable"), clock.Now())
	o.started = row.claimedAt
	require.Equal(t, statusPending, o.status)

	// ...but the outcome is written only after the lease ran out and the maximum age passed.
	clock.Advance(2 * time.Hour)
	other.reclaim(t.Context())
	in, err := outbox.Get(t.Context(), b.pool, "old-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDead, in.Status, "past its maximum age")
	require.Equal(t, []string{"old-2"}, claimedKeys(claimRows(t, other, "webhook")), "a dead head does not hold its key back")

	sender.writeOutcomes(t.Context(), []outcome{o})
	in, err = outbox.Get(t.Context(), b.pool, "old-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDead, in.Status, "a late retry does not revive a row past its maximum age")
	require.Empty(t, claimedKeys(claimRows(t, other, "webhook")))
	att := attemptsOf(t, b.pool, "old-1")
	require.Len(t, att, 2, "the late attempt is still logged")
}

// A head that reclaim sends to dead (its relay vanished during its last attempt) lets
// the next row of its key go. That row may lie far behind where claims start (it waited
// for its head while other rows moved the start on); the next claim must find it, not
// only the claim from the index's head once a poll interval later.
func TestRowUnblockedByReclaimIsClaimedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.MaxAttempts, cfg.Lease = 1, 10*time.Second
	cfg.PollInterval = time.Hour // no periodic claim from the head during the test
	r := b.newRelay(t, cfg)
	enqueueOrdered(t, b.pool, "head", "k")
	enqueueOrdered(t, b.pool, "tail", "k")
	_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, next_attempt_at)
		VALUES ('later', 'webhook', '{}', now() + interval '1 hour')`)
	require.NoError(t, err)

	require.Equal(t, 1, claimOnce(t, r), "the head (from the index's head: nothing claimed yet)")
	clock.Advance(2 * time.Hour)
	require.Equal(t, 1, claimOnce(t, r), "'later', which moves where claims start past the tail")
	require.True(t, r.instances["webhook"].scanFrom.After(clock.Now().Add(-2*time.Hour)))

	r.reclaim(t.Context()) // the head's lease ran out on its last attempt: dead
	in, err := outbox.Get(t.Context(), b.pool, "head")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDead, in.Status)
	require.Equal(t, 1, claimOnce(t, r), "the tail, no longer held back by its head")
}

// The outcome of a row with an ordering key lets the key's next row go, which may lie
// behind where claims start. When no claim rides with that outcome (the relay holds all
// the rows it may), the next claim must still start at the head of the index, not a
// poll interval later: whether the round writes it, or, when PostgreSQL refuses the
// batch for its data, salvage does (claimLoop's refused branch).
func TestOrderedOutcomeWithoutAClaimRescansNextTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		answer json.RawMessage
	}{
		{"WrittenByTheRound", nil},
		{"Salvaged", json.RawMessage(`{"n": 1e1000000}`)}, // a number jsonb refuses
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			_, cfg := b.clockedConfig(t)
			r := b.newRelay(t, cfg)
			enqueueOrdered(t, b.pool, "k-1", "k")
			rows := claimRows(t, r, "webhook")
			require.Len(t, rows, 1)
			out := r.decide(r.instances["webhook"], rows[0], tc.answer, nil, r.now())
			out.started = r.now()

			r.rescan.Store(false)
			// No room: the round only writes the outcome. The instance holds the rows (one
			// that holds none claims a row all the same).
			r.claimedRows.Store(int64(r.maxClaimed))
			r.instances["webhook"].claimed.Store(int64(r.maxClaimed))
			claimed, wrote, _, _, err := r.claimRound(t.Context(), []outcome{out}, true)
			if tc.answer != nil {
				require.True(t, refused(err), "the batch is refused: %v", err)
				require.Empty(t, r.salvage(t.Context(), []outcome{out}, err), "claimLoop's refused branch")
			} else {
				require.NoError(t, err)
				require.True(t, wrote)
				require.Zero(t, claimed)
			}
			in, err := outbox.Get(t.Context(), b.pool, "k-1")
			require.NoError(t, err)
			require.Equal(t, outbox.StatusDelivered, in.Status)
			require.True(t, r.rescan.Load(), "the next claim starts at the head of the index")
		})
	}
}

// An API token scoped to slack only cannot create, read or list webhook intents; one
// intent of its own with an ordering key and a far not_before used to hold back every
// later application row of that ordering key on every connector, for a century. Its
// ordering keys are its own (intent.Service keeps them within the token).
func TestScopedTokenCannotStallOtherConnectorsOrderingKey(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)

	svc := &intent.Service{Pool: b.pool, Policy: &intent.Policy{Tokens: []intent.Token{
		{Name: "slackbot", Connectors: []string{"slack"}},
	}}}
	later := time.Now().AddDate(100, 0, 0)
	_, err := svc.Create(t.Context(), &svc.Policy.Tokens[0], "agent-1", intent.CreateRequest{
		Connector: "slack", Payload: json.RawMessage(`{"channel":"C01","text":"hi"}`),
		OrderingKey: "customer-42", NotBefore: &later,
	})
	require.NoError(t, err)

	enqueueOrdered(t, b.pool, "app-1", "customer-42") // the application's own webhook row
	require.Equal(t, []string{"app-1"}, claimedKeys(claimRows(t, r, "webhook")),
		"the application's webhook row waits a century behind a slack-only token's intent")
}
