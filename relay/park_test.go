package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// parkedSetup is inFlightSetup, and then the head's attempt fails with a retry an hour
// later, written with a claim round. It returns the head's row and the retry's time.
func parkedSetup(t *testing.T, n int) (b *testBundle, clock *testClock, r *Relay, head claimed, retryAt time.Time) {
	t.Helper()
	b, clock, r, head = inFlightSetup(t, n)
	o := failHead(t, r, head, connectors.RetryAfter(errors.New("receiver unavailable"), time.Hour))
	require.Equal(t, outbox.StatusPending, o.status)
	return b, clock, r, head, *o.nextAt
}

// inFlightSetup enqueues a head and n rows behind it on ordering key "k", plus "soon" and
// "later", rows of the key scheduled 10 minutes and 2 hours after the relay's clock, and
// claims the head, which it returns.
func inFlightSetup(t *testing.T, n int) (b *testBundle, clock *testClock, r *Relay, head claimed) {
	t.Helper()
	b = setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r = b.newRelay(t, cfg)
	msgs := []outbox.Message{{Key: "head", Connector: "webhook", OrderingKey: "k", Payload: []int{0}}}
	for i := 1; i <= n; i++ {
		msgs = append(msgs, outbox.Message{Key: fmt.Sprintf("f-%d", i), Connector: "webhook", OrderingKey: "k", Payload: []int{i}})
	}
	msgs = append(msgs,
		outbox.Message{Key: "soon", Connector: "webhook", OrderingKey: "k", Payload: []int{-1}, NotBefore: clock.Now().Add(10 * time.Minute)},
		outbox.Message{Key: "later", Connector: "webhook", OrderingKey: "k", Payload: []int{-2}, NotBefore: clock.Now().Add(2 * time.Hour)})
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)

	require.Equal(t, 1, claimOnce(t, r), "the head; the rows behind it wait")
	head = <-r.instances["webhook"].jobs
	require.Equal(t, "head", head.key)
	return b, clock, r, head
}

// failHead writes the outcome of row c, claimed, whose attempt failed with err, with a
// claim round, and returns it.
func failHead(t *testing.T, r *Relay, c claimed, err error) outcome {
	t.Helper()
	inst := r.instances["webhook"]
	o := r.decide(inst, c, nil, err, r.cfg.NowFunc())
	o.started = r.cfg.NowFunc()
	_, wrote, _, _, err := r.claimRound(t.Context(), []outcome{o}, true)
	require.NoError(t, err)
	require.True(t, wrote)
	r.done(inst, c)
	return o
}

// requireClaimSkipsParked checks that a claim from the head of the index does not read
// the n rows "f-…", parked until until: it reads at most a fifth of the buffers it reads
// with them due. It leaves them parked until until.
func requireClaimSkipsParked(t *testing.T, b *testBundle, clock *testClock, n int, until time.Time) {
	t.Helper()
	ctx := t.Context()
	scan := func() int {
		lines := pgtest.Explain(t, b.pool, claimSQL, "webhook", clock.Now().Add(30*time.Second), 1000, "r",
			clock.Now().Add(time.Hour), pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, int64(1<<20))
		return pgtest.ScanBuffers(t, lines, "Index Scan using outbox_pending_due")
	}
	setAll := func(at time.Time) {
		_, err := b.pool.Exec(ctx, `UPDATE outbox SET next_attempt_at = $1 WHERE idempotency_key LIKE 'f-%'`, at)
		require.NoError(t, err)
	}
	scan() // the first scan marks the dead entries as such
	parkedScan := scan()
	setAll(clock.Now().Add(-time.Hour))
	scan()
	dueScan := scan()
	require.Greater(t, dueScan, 2*n, "unparked, the same claim reads every row behind the head, and looks up its key")
	// Parked, it reads at most the index entries their former versions left (a scan
	// marks them dead once no snapshot can see them), not the rows nor their keys.
	require.Less(t, parkedScan*5, dueScan, "the parked rows are not due: %d buffers against %d", parkedScan, dueScan)
	setAll(until)
}

// rowState is a row's next_attempt_at and last_error.
func rowState(t *testing.T, b *testBundle, key string) (time.Time, string) {
	t.Helper()
	in, err := outbox.Get(t.Context(), b.pool, key)
	require.NoError(t, err)
	return in.NextAttemptAt, in.LastError
}

// Rows waiting behind a head whose attempt failed cannot go before its retry. Every
// claim used to read each of them again from outbox_pending_due and look up its key's
// earlier rows, about 15–25 µs a row, so a key with thousands of rows behind a failing
// head slowed every claim of its connector (and of the round) until the head went. They
// are parked at the retry's time instead, saying why, and go once the head has.
func TestRowsBehindAFailingHeadWaitForItsRetry(t *testing.T) {
	t.Parallel()
	const n = 300
	ctx := t.Context()
	b, clock, r, head, retryAt := parkedSetup(t, n)

	var parked int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox
		WHERE idempotency_key LIKE 'f-%' AND next_attempt_at = $1 AND last_error = $2`,
		retryAt, outbox.WaitingBehind(head.id, "head")).Scan(&parked))
	require.Equal(t, n, parked, "every row behind the head waits for its retry")
	// Against the times they were enqueued with (parkedSetup's clock has not moved): read
	// after the head's failure, they would show whatever the parking did to them.
	at, why := rowState(t, b, "soon")
	require.WithinDuration(t, clock.Now().Add(10*time.Minute), at, time.Millisecond,
		"a row not yet due is left as it is: canceling the head could not give its time back")
	require.Empty(t, why)
	at, why = rowState(t, b, "later")
	require.WithinDuration(t, clock.Now().Add(2*time.Hour), at, time.Millisecond, "a row scheduled after the retry keeps its time")
	require.Empty(t, why)

	// A claim from the head of the index no longer reads them.
	requireClaimSkipsParked(t, b, clock, n, retryAt)

	// At the retry's time the head goes first; the rows behind it wait for it.
	clock.Advance(time.Hour + time.Second)
	require.Equal(t, 1, claimOnce(t, r))
	inst := r.instances["webhook"]
	again := <-inst.jobs
	require.Equal(t, "head", again.key)
	o := r.decide(inst, again, json.RawMessage(`{}`), nil, clock.Now())
	o.started = clock.Now()
	took, wrote, _, _, err := r.claimRound(ctx, []outcome{o}, true)
	require.NoError(t, err)
	require.True(t, wrote)
	require.Equal(t, 1, took, "the round that writes the head's delivery takes the key's next row")
	r.done(inst, again)
	next := <-inst.jobs
	require.Equal(t, "f-1", next.key)
	_, why = rowState(t, b, "f-1")
	require.Empty(t, why, "taken, it waits no longer")
	_, why = rowState(t, b, "f-2")
	require.Equal(t, outbox.WaitingBehind(head.id, "head"), why, "still waiting (behind f-1 now, which the text does not claim to follow)")
}

// A row parked behind a head that fails again is parked at the new retry.
func TestParkedRowsFollowTheHeadsNextRetry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, clock, r, head, retryAt := parkedSetup(t, 3)
	clock.Advance(time.Hour + time.Second)
	require.Equal(t, 1, claimOnce(t, r))
	inst := r.instances["webhook"]
	again := <-inst.jobs
	o := r.decide(inst, again, nil, connectors.RetryAfter(errors.New("receiver unavailable"), 2*time.Hour), clock.Now())
	o.started = clock.Now()
	_, _, _, _, err := r.claimRound(ctx, []outcome{o}, true)
	require.NoError(t, err)
	r.done(inst, again)
	at, why := rowState(t, b, "f-3")
	require.True(t, at.After(retryAt.Add(time.Hour)), "parked at the second retry, %s", at)
	require.Equal(t, *o.nextAt, at)
	require.Equal(t, outbox.WaitingBehind(head.id, "head"), why)
}

// Canceling the failing head lets the rows parked behind it go at once, not at the retry
// that will not come; a row scheduled for later keeps its time.
func TestCancelingAFailingHeadReleasesTheRowsParkedBehindIt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, _, r, _, retryAt := parkedSetup(t, 3)
	soon, _ := rowState(t, b, "soon")
	// A row of another key, parked behind a row of its own, is not released.
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload, ordering_key, next_attempt_at, last_error)
		VALUES ('other', 'webhook', '{}', 'other', $1, $2)`, retryAt, outbox.WaitingBehind(1<<40, "gone"))
	require.NoError(t, err)

	res, err := ops.Cancel(ctx, b.pool, []string{"head"}, "test", "poison", time.Time{})
	require.NoError(t, err)
	require.Equal(t, []string{"head"}, res.Canceled)
	for _, key := range []string{"f-1", "f-2", "f-3"} {
		at, why := rowState(t, b, key)
		require.True(t, at.Before(retryAt.Add(-30*time.Minute)), "%s due again: %s", key, at)
		require.Empty(t, why)
	}
	at, _ := rowState(t, b, "soon")
	require.Equal(t, soon, at)
	at, why := rowState(t, b, "other")
	require.Equal(t, retryAt, at)
	require.NotEmpty(t, why)

	require.Equal(t, 1, claimOnce(t, r), "the key's next row, without waiting for the canceled head's retry")
	require.Equal(t, "f-1", (<-r.instances["webhook"].jobs).key)
}

// requireDeliveredFromCreation delivers f-1, which r has claimed, and requires
// outboxd_commit_to_delivery_seconds to hold that one delivery, measured from parked's
// creation (why says what it was not measured from).
func requireDeliveredFromCreation(t *testing.T, b *testBundle, clock *testClock, r *Relay, parked outbox.Intent, why string) {
	t.Helper()
	inst := r.instances["webhook"]
	next := <-inst.jobs
	require.Equal(t, "f-1", next.key)
	r.deliver(t.Context(), inst, next)
	require.Equal(t, statusDelivered, (<-r.results).status)
	n, sum := histogramOf(t, b.registry, "outboxd_commit_to_delivery_seconds", "webhook")
	require.EqualValues(t, 1, n)
	require.InDelta(t, clock.Now().Sub(parked.CreatedAt).Seconds(), sum, 1, why)
}

// A row parked behind a failing head took the head's retry as its next_attempt_at,
// which is no NotBefore of its own: outboxd_commit_to_delivery_seconds measures it from
// its creation, as any row that waited for an earlier row of its key, not from the
// retry (which left the hour it waited out of the histogram).
func TestCommitToDeliveryOfAParkedRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, clock, r, _, _ := parkedSetup(t, 1)
	parked, err := outbox.Get(ctx, b.pool, "f-1")
	require.NoError(t, err)

	clock.Advance(time.Hour + time.Second)
	require.Equal(t, 1, claimOnce(t, r))
	inst := r.instances["webhook"]
	head := <-inst.jobs
	o := r.decide(inst, head, json.RawMessage(`{}`), nil, clock.Now())
	o.started = clock.Now()
	_, _, _, _, err = r.claimRound(ctx, []outcome{o}, true)
	require.NoError(t, err)
	r.done(inst, head)
	requireDeliveredFromCreation(t, b, clock, r, parked, "measured from its creation, not from the head's retry")
}

// A row released by canceling the head it was parked behind is measured from its
// creation too, not from the cancel.
func TestCommitToDeliveryOfARowReleasedByACancel(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, clock, r, _, _ := parkedSetup(t, 1)
	parked, err := outbox.Get(ctx, b.pool, "f-1")
	require.NoError(t, err)

	clock.Advance(30 * time.Minute)
	_, err = ops.Cancel(ctx, b.pool, []string{"head"}, "test", "poison", clock.Now())
	require.NoError(t, err)
	require.Equal(t, 1, claimOnce(t, r))
	requireDeliveredFromCreation(t, b, clock, r, parked, "measured from its creation, not from the cancel")
}

// A parked row that is itself canceled waits for nothing any more: its last_error no
// longer says it waits behind the failing head (list, inspect, the API and MCP show it).
func TestCancelingAParkedRowDropsItsParkingText(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, _, _, _, _ := parkedSetup(t, 2)
	res, err := ops.Cancel(ctx, b.pool, []string{"f-2"}, "test", "not needed", time.Time{})
	require.NoError(t, err)
	require.Equal(t, []string{"f-2"}, res.Canceled)
	in, err := outbox.Get(ctx, b.pool, "f-2")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusCanceled, in.Status)
	require.Empty(t, in.LastError)
}

// waitingSetup enqueues a head and three rows behind it on ordering key "k", plus "soon",
// a row of the key scheduled 5 minutes after the relay's clock, and puts the head in
// status (held, or awaiting_approval) as an operator's wait.
func waitingSetup(t *testing.T, status string) (b *testBundle, clock *testClock, r *Relay, head outbox.Intent) {
	t.Helper()
	ctx := t.Context()
	b = setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r = b.newRelay(t, cfg)
	head = enqueueOrdered(t, b.pool, "head", "k")
	for _, key := range []string{"f-1", "f-2", "f-3"} {
		enqueueOrdered(t, b.pool, key, "k")
	}
	_, err := outbox.Enqueue(ctx, b.pool, outbox.Message{Key: "soon", Connector: "webhook", OrderingKey: "k",
		Payload: []int{1}, NotBefore: clock.Now().Add(5 * time.Minute)})
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = $1, attempts = CASE WHEN $1 = 'held' THEN 1 ELSE 0 END,
		ambiguous = ($1 = 'held') WHERE idempotency_key = 'head'`, status)
	require.NoError(t, err)
	return b, clock, r, head
}

// Rows behind a row held for an operator, or awaiting approval, wait for a person, for
// hours maybe; every claim read them again meanwhile, as behind a failing row. They are
// parked a minute at a time, renewed while the row waits, and released by the
// operator's decision.
func TestRowsBehindARowWaitingForAnOperatorAreParked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status string
		decide func(t *testing.T, b *testBundle)
	}{
		{outbox.StatusHeld, func(t *testing.T, b *testBundle) {
			res, err := ops.Replay(t.Context(), b.pool, ops.Selection{Keys: []string{"head"}}, ops.ReplayOptions{Actor: "test"})
			require.NoError(t, err)
			require.Equal(t, []string{"head"}, res.Replayed)
		}},
		{outbox.StatusAwaitingApproval, func(t *testing.T, b *testBundle) {
			_, err := ops.Approve(t.Context(), b.pool, "head", "test", "", time.Time{})
			require.NoError(t, err)
		}},
		{"rejected", func(t *testing.T, b *testBundle) {
			_, err := ops.Reject(t.Context(), b.pool, "head", "test", "", time.Time{})
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.status, func(t *testing.T) {
			t.Parallel()
			status := tc.status
			if status == "rejected" {
				status = outbox.StatusAwaitingApproval
			}
			b, clock, r, head := waitingSetup(t, status)
			soon, _ := rowState(t, b, "soon")
			r.parkWaiting(t.Context())
			first, why := rowState(t, b, "f-3")
			require.Equal(t, outbox.WaitingForOperator(head.ID, "head"), why)
			require.WithinDuration(t, r.now().Add(parkFor), first, time.Millisecond)
			at, why := rowState(t, b, "soon")
			require.Equal(t, soon, at, "a row not yet due keeps its time")
			require.Empty(t, why)
			require.Zero(t, claimOnce(t, r), "nothing is due")

			// While the row waits, the next pass before the parking runs out renews it.
			clock.Advance(parkFor - statsInterval/2)
			r.parkWaiting(t.Context())
			renewed, _ := rowState(t, b, "f-3")
			require.True(t, renewed.After(first), "renewed: %s, then %s", first, renewed)
			require.Zero(t, claimOnce(t, r))

			// The operator's decision releases them.
			tc.decide(t, b)
			for _, key := range []string{"f-1", "f-2", "f-3"} {
				at, why := rowState(t, b, key)
				require.True(t, at.Before(clock.Now()), "%s due again: %s", key, at)
				require.Empty(t, why)
			}
			want := "head" // approved or replayed, it goes first
			if tc.status == "rejected" {
				want = "f-1"
			}
			require.Equal(t, 1, claimOnce(t, r))
			require.Equal(t, want, (<-r.instances["webhook"].jobs).key)
		})
	}
}

// A row parked behind a row that waits for an operator is due again when its parking
// runs out, if no pass renews it: the row it waited for may have ended some other way
// (plain SQL, a late delivery).
func TestParkedBehindAnOperatorGoesWhenTheWaitEndsOtherwise(t *testing.T) {
	t.Parallel()
	b, clock, r, _ := waitingSetup(t, outbox.StatusHeld)
	r.parkWaiting(t.Context())
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered' WHERE idempotency_key = 'head'`)
	require.NoError(t, err)
	r.parkWaiting(t.Context())
	require.Zero(t, claimOnce(t, r), "still parked")
	clock.Advance(parkFor + time.Second)
	require.Equal(t, 1, claimOnce(t, r))
	require.Equal(t, "f-1", (<-r.instances["webhook"].jobs).key)
	_, why := rowState(t, b, "f-1")
	require.Empty(t, why)
}

// An operator's decision on a row waiting for one releases the rows parked behind it at
// once, also when a relay's parking pass runs meanwhile. The pass read the row as held
// when it began, then reached a row behind it after the decision had committed: it
// parked that row anew behind a row no longer held, for a minute. Here the pass is held
// up (a trigger waits for a lock the test holds) at a row of another key it parks first,
// and the head is canceled then: with the rows behind it parked by an earlier pass,
// which the decision releases, and with them not parked yet, which the decision does not
// touch (the pass first parked them once the decision had committed).
func TestDecisionDuringAParkingPassReleasesTheRowsBehind(t *testing.T) {
	t.Parallel()
	for _, parkedBefore := range []bool{true, false} {
		t.Run(fmt.Sprintf("parked before: %t", parkedBefore), func(t *testing.T) {
			t.Parallel()
			decisionDuringAParkingPass(t, parkedBefore)
		})
	}
}

func decisionDuringAParkingPass(t *testing.T, parkedBefore bool) {
	t.Helper()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	enqueueOrdered(t, b.pool, "head", "k")
	enqueueOrdered(t, b.pool, "other", "o") // newer: the pass parks behind it first
	enqueueOrdered(t, b.pool, "o-1", "o")
	enqueueOrdered(t, b.pool, "f-1", "k")
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET status = 'held', attempts = 1, ambiguous = true
		WHERE idempotency_key IN ('head', 'other')`)
	require.NoError(t, err)
	if parkedBefore {
		r.parkWaiting(ctx)
		clock.Advance(parkFor - statsInterval/2) // the next pass renews both
	}
	cancelErr := duringHeldPass(t, b, "o-1", r.parkWaiting, func() error {
		_, err := ops.Cancel(ctx, b.pool, []string{"head"}, "test", "", time.Time{})
		return err
	})
	require.NoError(t, cancelErr)
	require.Zero(t, dbErrorsTotal(t, r), "database errors")

	at, why := rowState(t, b, "f-1")
	require.Empty(t, why, "head is canceled")
	require.True(t, at.Before(clock.Now()), "due: %s", at)
	at, why = rowState(t, b, "o-1")
	require.Equal(t, outbox.WaitingForOperator(mustGet(t, b, "other").ID, "other"), why, "other still held")
	require.WithinDuration(t, clock.Now().Add(parkFor), at, time.Millisecond, "parked for a minute from the pass")
}

// duringHeldPass runs pass in the background, held up by a trigger at its update of row
// at (a key; the trigger waits for an advisory lock the test holds), and once it waits there runs
// action in the background too; when action has finished, or waits for a row lock (the
// pass's), it lets the pass go on, waits for both, and returns action's error.
func duringHeldPass(t *testing.T, b *testBundle, at string, pass func(context.Context), action func() error) error {
	t.Helper()
	ctx := t.Context()
	unlock, _ := blockAtUpdate(t, b.pool, at, "NEW.last_error IS NOT NULL")
	waiting := func(events ...string) bool { return sessionsWaiting(t, b.pool, events...) > 0 }

	passed := make(chan struct{})
	go func() { defer close(passed); pass(ctx) }()
	require.Eventually(t, func() bool { return waiting("advisory") }, waitTimeout, 10*time.Millisecond, "the pass waits at %s", at)
	acted := make(chan error, 1)
	go func() { acted <- action() }()
	var actionErr error
	done := false
	require.Eventually(t, func() bool {
		select {
		case actionErr = <-acted:
			done = true
			return true
		default:
			return waiting("transactionid", "tuple") // or it waits for the pass
		}
	}, waitTimeout, 10*time.Millisecond)
	unlock()
	<-passed
	if !done {
		actionErr = <-acted
	}
	return actionErr
}

func mustGet(t *testing.T, b *testBundle, key string) outbox.Intent {
	t.Helper()
	in, err := outbox.Get(t.Context(), b.pool, key)
	require.NoError(t, err)
	return in
}

// deliverInRound writes the delivery of row c, claimed, with a claim round, and returns
// how many rows the round took.
func deliverInRound(t *testing.T, r *Relay, c claimed) int {
	t.Helper()
	inst := r.instances["webhook"]
	o := r.decide(inst, c, json.RawMessage(`{}`), nil, r.cfg.NowFunc())
	o.started = r.cfg.NowFunc()
	took, wrote, _, _, err := r.claimRound(t.Context(), []outcome{o}, true)
	require.NoError(t, err)
	require.True(t, wrote)
	r.done(inst, c)
	return took
}

// A key's rows go out one at a time, and every claim read each row waiting behind the
// one in flight again and looked up its key's earlier rows: a backlog of N rows of one
// key took N claims each reading what was left of it (BenchmarkOneKeyBacklog: 22.6 ms a
// row with 2,000 rows, 10.5 with 1,000). The relay parks them behind its row in flight,
// a minute at a time, and each row's outcome makes the key's next row due.
func TestRowsBehindARowInFlightAreParked(t *testing.T) {
	t.Parallel()
	const n = 300
	ctx := t.Context()
	b, clock, r, head := inFlightSetup(t, n)
	inst := r.instances["webhook"]

	r.parkInFlight(ctx)
	until := clock.Now().Add(parkFor)
	var parked int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox
		WHERE idempotency_key LIKE 'f-%' AND next_attempt_at = $1 AND last_error = $2`,
		until, outbox.WaitingForDelivery(head.id, "head")).Scan(&parked))
	require.Equal(t, n, parked, "every row behind the row in flight is parked")
	at, why := rowState(t, b, "soon")
	require.WithinDuration(t, clock.Now().Add(10*time.Minute), at, time.Millisecond, "a row not yet due keeps its time")
	require.Empty(t, why)
	requireClaimSkipsParked(t, b, clock, n, until)

	// While the row is in flight, the pass before the parking runs out renews it.
	clock.Advance(parkFor - r.cfg.PollInterval/2)
	r.parkInFlight(ctx)
	renewed, _ := rowState(t, b, "f-1")
	require.True(t, renewed.After(until), "renewed: %s, then %s", until, renewed)

	// Its outcome makes the next row due, and the round takes it; the others stay.
	parkedBefore := mustGet(t, b, "f-2")
	released := mustGet(t, b, "f-1")
	require.Equal(t, 1, deliverInRound(t, r, head), "the round that writes the delivery takes the key's next row")
	next := <-inst.jobs
	require.Equal(t, "f-1", next.key)
	require.Empty(t, mustGet(t, b, "f-1").LastError)
	require.Equal(t, released.CreatedAt, next.dueAt, "due from its creation, where committedFor measures it from")
	still := mustGet(t, b, "f-2")
	require.Equal(t, parkedBefore.NextAttemptAt, still.NextAttemptAt)
	require.Equal(t, parkedBefore.LastError, still.LastError, "still parked behind the head, whichever row is in flight now")
	for i := 2; i <= 4; i++ {
		require.Equal(t, 1, deliverInRound(t, r, next))
		next = <-inst.jobs
		require.Equal(t, fmt.Sprintf("f-%d", i), next.key, "in order, one at a time")
	}
	require.Zero(t, claimOnce(t, r), "f-5 waits for f-4")
}

// Rows parked behind a row in flight whose attempt fails wait for its retry instead, an
// hour later here: their minute's parking would run out first, and every claim would
// read them again until the retry.
func TestParkedBehindARowInFlightFollowItsRetry(t *testing.T) {
	t.Parallel()
	b, clock, r, head := inFlightSetup(t, 3)
	r.parkInFlight(t.Context())
	o := failHead(t, r, head, connectors.RetryAfter(errors.New("receiver unavailable"), time.Hour))
	for _, key := range []string{"f-1", "f-2", "f-3"} {
		at, why := rowState(t, b, key)
		require.Equal(t, *o.nextAt, at, key)
		require.Equal(t, outbox.WaitingBehind(head.id, "head"), why, key)
	}
	at, why := rowState(t, b, "soon")
	require.WithinDuration(t, clock.Now().Add(10*time.Minute), at, time.Millisecond, "a row not yet due keeps its time")
	require.Empty(t, why)
}

// A row in flight that goes dead lets its key go on: its outcome makes the next row due,
// and the round takes it.
func TestRowInFlightGoingDeadReleasesTheNextRow(t *testing.T) {
	t.Parallel()
	b, _, r, head := inFlightSetup(t, 2)
	r.parkInFlight(t.Context())
	o := failHead(t, r, head, connectors.Permanent(errors.New("422 Unprocessable Entity")))
	require.Equal(t, outbox.StatusDead, o.status)
	jobs := r.instances["webhook"].jobs
	require.Len(t, jobs, 1, "the round took the next row")
	require.Equal(t, "f-1", (<-jobs).key)
	_, why := rowState(t, b, "f-2")
	require.Equal(t, outbox.WaitingForDelivery(head.id, "head"), why, "still parked")
}

// The outcome of a row in flight that a relay writes while its parking pass runs
// releases the next row, whichever comes first. The pass read the row as in flight
// before the outcome committed, and would have parked the row behind it for a minute
// after the outcome found nothing parked to release. Here the pass is held up (a trigger
// waits for a lock the test holds) at a row behind another key's row in flight, and the
// head's delivery is written meanwhile.
func TestOutcomeDuringAParkingPassReleasesTheNextRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	enqueueOrdered(t, b.pool, "head", "k")
	enqueueOrdered(t, b.pool, "other", "o")
	enqueueOrdered(t, b.pool, "f-1", "k")
	enqueueOrdered(t, b.pool, "o-1", "o")
	require.Equal(t, 2, claimOnce(t, r))
	inst := r.instances["webhook"]
	first, second := <-inst.jobs, <-inst.jobs
	head, other := first, second
	if head.key != "head" {
		head, other = other, head
	}
	took := 0
	err := duringHeldPass(t, b, "o-1", r.parkInFlight, func() error {
		o := r.decide(inst, head, json.RawMessage(`{}`), nil, r.cfg.NowFunc())
		o.started = r.cfg.NowFunc()
		var err error
		took, _, _, _, err = r.claimRound(ctx, []outcome{o}, true)
		return err
	})
	require.NoError(t, err)
	r.done(inst, head)
	require.Zero(t, dbErrorsTotal(t, r), "database errors")

	require.Equal(t, 1, took+claimOnce(t, r), "f-1 is due")
	require.Equal(t, "f-1", (<-inst.jobs).key)
	_, why := rowState(t, b, "o-1")
	require.Equal(t, outbox.WaitingForDelivery(other.id, "other"), why, "parked behind the other key's row in flight")
}

// A running relay parks the rows behind its row in flight within a poll interval, when
// there are at least parkBehindMin of them, and once that row is delivered sends them
// one at a time, in order.
func TestRunningRelayParksBehindItsRowInFlight(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	hold := make(chan struct{})
	b := setup(t, receiver.Options{OnEffect: func(e receiver.Effect) {
		if e.Key == "head" {
			<-hold
		}
	}})
	var once sync.Once
	unhold := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(unhold)
	hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Enforced, Timeout: waitTimeout})
	require.NoError(t, err)
	cfg := b.fastConfig()
	cfg.Lease = 2 * waitTimeout
	head := enqueueOrdered(t, b.pool, "head", "k")
	want := []string{"head"}
	for i := 1; i <= parkBehindMin; i++ {
		want = append(want, enqueueOrdered(t, b.pool, fmt.Sprintf("f-%d", i), "k").Key)
	}
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: hook}})

	require.Eventually(t, func() bool {
		var parked int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE last_error = $1`,
			outbox.WaitingForDelivery(head.ID, "head")).Scan(&parked))
		return parked == parkBehindMin
	}, waitTimeout, 10*time.Millisecond, "the rows behind the head are parked")
	unhold()
	for _, key := range want {
		waitStatus(t, b.pool, key, outbox.StatusDelivered)
	}
	var got []string
	for _, e := range b.receiver.EffectLog() {
		got = append(got, e.Key)
	}
	require.Equal(t, want, got, "one at a time, in order")
}

// A row in flight whose lease runs out on its last attempt goes dead by reclaim, and
// lets its key go on: the next row, parked behind it, is due at once, not at the end of
// its minute's parking (the relay that parked it, which would have renewed it, is gone).
func TestRowInFlightReclaimedAsDeadReleasesTheNextRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.MaxAttempts, cfg.Lease = 1, 10*time.Second
	r := b.newRelay(t, cfg)
	head := enqueueOrdered(t, b.pool, "head", "k")
	enqueueOrdered(t, b.pool, "f-1", "k")
	enqueueOrdered(t, b.pool, "f-2", "k")
	require.Equal(t, 1, claimOnce(t, r), "the head")
	require.Equal(t, "head", (<-r.instances["webhook"].jobs).key)
	r.parkInFlight(ctx)
	_, why := rowState(t, b, "f-1")
	require.Equal(t, outbox.WaitingForDelivery(head.ID, "head"), why)

	clock.Advance(cfg.Lease + time.Second)
	r.reclaim(ctx) // the head's lease ran out on its last attempt: dead
	require.Equal(t, outbox.StatusDead, mustGet(t, b, "head").Status)
	require.Equal(t, 1, claimOnce(t, r), "f-1, no longer held back by its head")
	require.Equal(t, "f-1", (<-r.instances["webhook"].jobs).key)
	_, why = rowState(t, b, "f-2")
	require.Equal(t, outbox.WaitingForDelivery(head.ID, "head"), why, "still parked")
}

// An operator's cancel or reject of a key's first row not finished lets the key's next
// row go at once, also when that row is parked behind another row: one the relay parked
// behind the key's row in flight, which was delivered meanwhile, names that row, not the
// one canceled (released by the delivery, and not yet claimed) or rejected (awaiting
// approval behind it).
func TestDecisionOnTheKeysFirstRowReleasesTheRowParkedBehindAnother(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status string // of "first", the row behind the head, once the head is delivered
		decide func(t *testing.T, b *testBundle)
	}{
		{"cancel", outbox.StatusPending, func(t *testing.T, b *testBundle) {
			res, err := ops.Cancel(t.Context(), b.pool, []string{"first"}, "test", "", time.Time{})
			require.NoError(t, err)
			require.Equal(t, []string{"first"}, res.Canceled)
		}},
		{"reject", outbox.StatusAwaitingApproval, func(t *testing.T, b *testBundle) {
			_, err := ops.Reject(t.Context(), b.pool, "first", "test", "", time.Time{})
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := setup(t, receiver.Options{})
			clock, cfg := b.clockedConfig(t)
			r := b.newRelay(t, cfg)
			inst := r.instances["webhook"]
			head := enqueueOrdered(t, b.pool, "head", "k")
			enqueueOrdered(t, b.pool, "first", "k")
			enqueueOrdered(t, b.pool, "next", "k")
			_, err := b.pool.Exec(ctx, `UPDATE outbox SET status = $1 WHERE idempotency_key = 'first'`, tc.status)
			require.NoError(t, err)
			require.Equal(t, 1, claimOnce(t, r), "the head")
			c := <-inst.jobs
			r.parkInFlight(ctx)
			_, why := rowState(t, b, "next")
			require.Equal(t, outbox.WaitingForDelivery(head.ID, "head"), why)

			// The head's delivery, written without a claim: "first" is due, or awaits
			// approval; "next" waits behind it.
			o := r.decide(inst, c, json.RawMessage(`{}`), nil, clock.Now())
			o.started = clock.Now()
			r.writeOutcomes(ctx, []outcome{o})
			r.done(inst, c)
			require.Equal(t, outbox.StatusDelivered, mustGet(t, b, "head").Status)

			tc.decide(t, b)
			at, why := rowState(t, b, "next")
			require.Empty(t, why, "nothing before it is unfinished")
			require.True(t, at.Before(clock.Now()), "due: %s", at)
			require.Equal(t, 1, claimOnce(t, r))
			require.Equal(t, "next", (<-inst.jobs).key)
		})
	}
}

// An operator's cancel of the key's first row not finished, parked behind the row in
// flight, that commits while that row's delivery is being written lets the key's next
// row go. The outcome waited for the cancel's lock on that row and then found it
// canceled, so released nothing; the cancel's snapshot did not see the delivery, so it
// released nothing either, and the next row waited a minute behind nothing. Here the
// cancel is held up (a trigger waits for a lock the test holds) at its update of the row
// until the outcome waits for it.
func TestCancelDuringAnOutcomeReleasesTheNextRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	inst := r.instances["webhook"]
	head := enqueueOrdered(t, b.pool, "head", "k")
	enqueueOrdered(t, b.pool, "first", "k")
	enqueueOrdered(t, b.pool, "next", "k")
	require.Equal(t, 1, claimOnce(t, r), "the head")
	c := <-inst.jobs
	r.parkInFlight(ctx)
	_, why := rowState(t, b, "first")
	require.Equal(t, outbox.WaitingForDelivery(head.ID, "head"), why)

	unlock, waiting := blockAtUpdate(t, b.pool, "first", "NEW.status = 'canceled'")

	canceled := make(chan error, 1)
	go func() {
		_, err := ops.Cancel(ctx, b.pool, []string{"first"}, "test", "", time.Time{})
		canceled <- err
	}()
	require.Eventually(t, func() bool { return waiting("advisory") > 0 }, waitTimeout, 10*time.Millisecond, "the cancel waits at its update")
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		o := r.decide(inst, c, json.RawMessage(`{}`), nil, clock.Now())
		o.started = clock.Now()
		r.writeOutcomes(ctx, []outcome{o})
	}()
	require.Eventually(t, func() bool { return waiting("transactionid") > 0 }, waitTimeout, 10*time.Millisecond, "the outcome waits for the cancel")
	unlock()
	require.NoError(t, <-canceled)
	<-wrote
	r.done(inst, c)
	require.Zero(t, dbErrorsTotal(t, r), "database errors")
	require.Equal(t, outbox.StatusDelivered, mustGet(t, b, "head").Status)
	require.Equal(t, outbox.StatusCanceled, mustGet(t, b, "first").Status)

	_, why = rowState(t, b, "next")
	require.Empty(t, why, "nothing before it is unfinished")
	require.Equal(t, 1, claimOnce(t, r))
	require.Equal(t, "next", (<-inst.jobs).key)
}

// A relay's outcomes that end rows of two ordering keys, written while an operator
// replays a finished row of each key, do not deadlock with the replay: the outcome locks
// the keys' next rows (lockNextSQL) and the replay the rows behind the rows it replays
// (ops, unpark), both in id order. Here a transaction the test holds keeps the replay
// waiting after it locked the first key's rows behind its row, until the outcome, whose
// batch names the second key first, waits for it.
func TestReplayDuringOutcomesOfTwoKeysDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	inst := r.instances["webhook"]
	for _, k := range []string{"a-0", "a-1", "a-2", "a-3", "b-0", "b-1", "b-2"} {
		enqueueOrdered(t, b.pool, k, k[:1])
	}
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET status = 'dead', attempts = 1 WHERE idempotency_key IN ('a-0', 'b-0')`)
	require.NoError(t, err)
	require.Equal(t, 2, claimOnce(t, r), "a-1 and b-1")
	first, second := <-inst.jobs, <-inst.jobs
	if first.key != "b-1" {
		first, second = second, first
	}
	r.parkInFlight(ctx)

	holder, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM outbox WHERE idempotency_key = 'a-3' FOR NO KEY UPDATE`)
	require.NoError(t, err)
	waiting := func(n int) bool { return sessionsWaiting(t, b.pool, "transactionid", "tuple") >= n }

	replayed := make(chan error, 1)
	go func() {
		_, err := ops.Replay(ctx, b.pool, ops.Selection{Keys: []string{"a-0", "b-0"}}, ops.ReplayOptions{Actor: "test"})
		replayed <- err
	}()
	require.Eventually(t, func() bool { return waiting(1) }, waitTimeout, 10*time.Millisecond, "the replay waits for a-3")
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		var outs []outcome
		for _, c := range []claimed{first, second} {
			o := r.decide(inst, c, json.RawMessage(`{}`), nil, clock.Now())
			o.started = clock.Now()
			outs = append(outs, o)
		}
		r.writeOutcomes(ctx, outs)
	}()
	require.Eventually(t, func() bool { return waiting(2) }, waitTimeout, 10*time.Millisecond, "the outcome waits for the replay")
	require.NoError(t, holder.Commit(ctx))
	require.NoError(t, <-replayed)
	<-wrote
	r.done(inst, first)
	r.done(inst, second)
	require.Zero(t, dbErrorsTotal(t, r), "database errors")
	require.Equal(t, outbox.StatusDelivered, mustGet(t, b, "a-1").Status)
	require.Equal(t, outbox.StatusDelivered, mustGet(t, b, "b-1").Status)
}

// A late delivery of a row held for an operator (its relay lost its lease, and the
// attempt did finish) is that row's outcome, and like any delivery makes its key's next
// row due at once, though that row was parked behind it as waiting for an operator.
func TestLateDeliveryOfAHeldRowReleasesTheNextRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	inst := r.instances["webhook"]
	head := enqueueOrdered(t, b.pool, "head", "k")
	enqueueOrdered(t, b.pool, "f-1", "k")
	enqueueOrdered(t, b.pool, "f-2", "k")
	require.Equal(t, 1, claimOnce(t, r), "the head")
	c := <-inst.jobs
	// As reclaim holds it for an operator once its lease runs out.
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET status = 'held', ambiguous = true, lease_owner = NULL,
		lease_expires_at = NULL WHERE idempotency_key = 'head'`)
	require.NoError(t, err)
	r.parkWaiting(ctx)
	_, why := rowState(t, b, "f-1")
	require.Equal(t, outbox.WaitingForOperator(head.ID, "head"), why)

	o := r.decide(inst, c, json.RawMessage(`{}`), nil, clock.Now())
	o.started = clock.Now()
	r.writeOutcomes(ctx, []outcome{o})
	r.done(inst, c)
	require.Equal(t, outbox.StatusDelivered, mustGet(t, b, "head").Status)
	at, why := rowState(t, b, "f-1")
	require.Empty(t, why)
	require.True(t, at.Before(clock.Now()), "due: %s", at)
	_, why = rowState(t, b, "f-2")
	require.Equal(t, outbox.WaitingForOperator(head.ID, "head"), why, "still parked, behind f-1 now")
	require.Equal(t, 1, claimOnce(t, r))
	require.Equal(t, "f-1", (<-inst.jobs).key)
}

// A pass parking the rows behind a held row does not lock that row: an operator's
// decision on it, which skips a row another transaction holds, was refused ("look again
// in a moment") while a pass ran, every 10 s. Here the pass is held up at the row
// behind the head while the head is canceled.
func TestDecisionDuringAParkingPassIsNotRefused(t *testing.T) {
	t.Parallel()
	b, _, r, _ := waitingSetup(t, outbox.StatusHeld)
	var res ops.CancelResult
	err := duringHeldPass(t, b, "f-1", r.parkWaiting, func() error {
		var err error
		res, err = ops.Cancel(t.Context(), b.pool, []string{"head"}, "test", "", time.Time{})
		return err
	})
	require.NoError(t, err)
	require.Equal(t, []string{"head"}, res.Canceled, "refused: %v", res.Refused)
	_, why := rowState(t, b, "f-1")
	require.Empty(t, why, "released by the cancel")
}

// A relay whose poll interval is longer than half a minute parks the rows behind its
// rows in flight for two poll intervals, so that its next pass renews them before they
// are due: parked for a minute, they were due between passes, and read by every claim.
func TestParkedBehindARowInFlightForTwoLongPollIntervals(t *testing.T) {
	t.Parallel()
	b, clock, r, _ := inFlightSetup(t, 1)
	r.cfg.PollInterval = 5 * time.Minute
	r.parkInFlight(t.Context())
	at, why := rowState(t, b, "f-1")
	require.True(t, strings.HasPrefix(why, outbox.ParkedPrefix), why)
	require.WithinDuration(t, clock.Now().Add(10*time.Minute), at, time.Millisecond)
}

// A row whose attempt has ended is in flight until the round that writes its outcome
// commits, and that round also claims its key's next row: a relay working off one key's
// backlog, whose rounds were slow while the rows behind were not parked yet, held no row
// of the key for most of the time, and a pass that ran only while it held one came too
// seldom to park them (BenchmarkOneKeyBacklog, at times as slow as before parking). A
// pass parks behind a row claimed since the last one, held or not.
func TestParkedBehindARowWhoseAttemptEnded(t *testing.T) {
	t.Parallel()
	b, _, r, head := inFlightSetup(t, 2)
	r.done(r.instances["webhook"], head) // its attempt ended; the outcome is not written yet
	r.parkInFlight(t.Context())
	_, why := rowState(t, b, "f-2")
	require.Equal(t, outbox.WaitingForDelivery(head.id, "head"), why)
}

// Rows behind a row in flight are parked only when there are at least parkBehindMin of
// them: writing a row twice (parked, released) costs more than the claims that read a
// few rows waiting behind a row in flight.
func TestFewRowsBehindARowInFlightAreNotParked(t *testing.T) {
	t.Parallel()
	b, _, r, _ := inFlightSetup(t, parkBehindMin-3) // with "soon" and "later", one short
	r.parkBehindMin = parkBehindMin
	r.parkInFlight(t.Context())
	_, why := rowState(t, b, "f-1")
	require.Empty(t, why, "not parked")
	enqueueOrdered(t, b.pool, "one-more", "k")
	r.parkInFlight(t.Context())
	_, why = rowState(t, b, "f-1")
	require.True(t, strings.HasPrefix(why, outbox.ParkedPrefix), why)
}
