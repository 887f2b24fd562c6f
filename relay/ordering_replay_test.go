package relay

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A relay's claim of the next row of a key (its head is dead) runs while an operator
// replays the head, and another relay claims then. The head's check "no later row of my
// key is delivering" read a snapshot in which the first claim had not committed, so both
// rows of the key went in flight at once; the replay now waits for that claim.
func TestReplayRacingAClaimOfTheNextRowKeepsOneRowOfTheKeyInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	a, other := b.namedRelay(t, cfg, "a"), b.namedRelay(t, cfg, "other")
	enqueueOrdered(t, b.pool, "k-1", "k")
	enqueueOrdered(t, b.pool, "k-2", "k")

	got := claimRows(t, a, "webhook")
	require.Equal(t, []string{"k-1"}, claimedKeys(got))
	o := a.decide(a.instances["webhook"], got[0], nil, connectors.Permanent(errors.New("422")), clock.Now())
	o.started = got[0].claimedAt
	a.writeOutcomes(t.Context(), []outcome{o}) // k-1 dead: k-2 may go

	// Relay a's claim of k-2, in a transaction that has not committed yet.
	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	defer tx.Rollback(t.Context())
	lease := clock.Now().Add(cfg.Lease)
	rows, err := tx.Query(t.Context(), claimSQL, "webhook", clock.Now(), 10, "a", lease,
		pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, int64(1<<20))
	require.NoError(t, err)
	var keys []string
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		keys = append(keys, vals[1].(string))
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"k-2"}, keys)

	// Meanwhile an operator replays k-1, and the other relay claims.
	type replayed struct {
		res ops.ReplayResult
		err error
	}
	done := make(chan replayed, 1)
	go func() {
		res, err := ops.Replay(t.Context(), b.pool, ops.Selection{Keys: []string{"k-1"}}, ops.ReplayOptions{Actor: "op", Now: clock.Now()})
		done <- replayed{res, err}
	}()
	// The replay either finishes, or waits for a lock (a fix may make it wait for the claim).
	var rp *replayed
	require.Eventually(t, func() bool {
		select {
		case got := <-done:
			rp = &got
			return true
		default:
		}
		var waiting bool
		require.NoError(t, b.pool.QueryRow(t.Context(),
			`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, waitTimeout, 10*time.Millisecond)
	var second []claimed
	if rp != nil { // replayed while the claim of k-2 is in progress
		second = claimRows(t, other, "webhook")
		require.NoError(t, tx.Commit(t.Context()))
	} else {
		require.NoError(t, tx.Commit(t.Context()))
		got := <-done
		rp = &got
		second = claimRows(t, other, "webhook")
	}
	require.NoError(t, rp.err)
	require.Equal(t, []string{"k-1"}, rp.res.Replayed)

	var inFlight int
	require.NoError(t, b.pool.QueryRow(t.Context(),
		`SELECT count(*) FROM outbox WHERE ordering_key = 'k' AND status = 'delivering'`).Scan(&inFlight))
	require.Empty(t, claimedKeys(second), "k-2 of the same key was being claimed")
	require.Equal(t, 1, inFlight, "two rows of one ordering key in flight at once")
}

// On a forwarded connector with the hold policy, an ambiguous attempt is held for an
// operator (decide), even on the last allowed attempt. The same ambiguous attempt found
// by reclaim (its relay vanished) went to dead instead, which let the next row of its
// ordering key go without the operator's decision.
func TestLeaseExpiryOnTheLastAttemptOfAHoldConnectorIsHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.MaxAttempts, cfg.Lease = 1, 10*time.Second
	hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
	require.NoError(t, err)
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: hook, OnAmbiguous: AmbiguousHold}})
	require.NoError(t, err)
	enqueueOrdered(t, b.pool, "h-1", "k")
	enqueueOrdered(t, b.pool, "h-2", "k")

	got := claimRows(t, r, "webhook")
	require.Equal(t, []string{"h-1"}, claimedKeys(got))
	// What decide does with an ambiguous failure of this last attempt:
	o := r.decide(r.instances["webhook"], got[0], nil, connectors.Ambiguous(errors.New("connection reset")), clock.Now())
	require.Equal(t, statusHeld, o.status)

	// What reclaim does when the same attempt's relay vanished:
	clock.Advance(cfg.Lease + time.Second)
	r.reclaim(t.Context())
	in, err := outbox.Get(t.Context(), b.pool, "h-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusHeld, in.Status, "an ambiguous attempt on a hold connector waits for an operator")
	require.Empty(t, claimedKeys(claimRows(t, r, "webhook")), "h-2 waits for the operator's decision on h-1")
}
