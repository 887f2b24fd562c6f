package relay

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/internal/replaylock"
	"github.com/outboxd/outboxd/outbox"
)

// waitAdvisory waits until a session of the test's database waits for an advisory lock,
// or until done (a buffered channel) holds a result, the work having gone on instead.
func waitAdvisory[T any](t *testing.T, b *testBundle, done chan T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory')`).Scan(&waiting))
		return waiting || len(done) > 0
	}, waitTimeout, 5*time.Millisecond)
}

// deadHead enqueues k-1 and k-2 on ordering key "k" and puts k-1 to dead, as an
// operator finds it to replay, and returns k-1.
func deadHead(t *testing.T, b *testBundle) outbox.Intent {
	t.Helper()
	head := enqueueOrdered(t, b.pool, "k-1", "k")
	enqueueOrdered(t, b.pool, "k-2", "k")
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead', attempts = 1 WHERE id = $1`, head.ID)
	require.NoError(t, err)
	return head
}

// holdClaimRound opens a transaction that holds the replay lock as a claim round under
// way does, until it commits or the test ends.
func holdClaimRound(t *testing.T, b *testBundle) pgx.Tx {
	t.Helper()
	round, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = round.Rollback(context.WithoutCancel(t.Context())) })
	_, err = round.Exec(t.Context(), replaylock.ClaimSQL)
	require.NoError(t, err)
	return round
}

// replayResult is what ops.Replay returned.
type replayResult struct {
	res ops.ReplayResult
	err error
}

// replayInBackground replays keys (as actor "op") in a goroutine and sends what it
// returned on the channel it returns.
func replayInBackground(t *testing.T, b *testBundle, opts ops.ReplayOptions, keys ...string) chan replayResult {
	t.Helper()
	opts.Actor = "op"
	done := make(chan replayResult, 1)
	go func() {
		res, err := ops.Replay(t.Context(), b.pool, ops.Selection{Keys: keys}, opts)
		done <- replayResult{res, err}
	}()
	return done
}

// A replay puts a dead row of an ordering key back to pending. A claim statement whose
// snapshot predates the replay's commit reads it as dead and may take the key's next row
// after that commit, while a newer claim takes the replayed row: two rows of the key in
// flight. Claim rounds and replays of ordered rows therefore exclude each other
// (internal/replaylock): a round waits for a replay under way, and a replay for the
// rounds under way.
func TestClaimRoundsAndReplaysOfOrderedRowsExcludeEachOther(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	head := enqueueOrdered(t, b.pool, "k-1", "k")
	enqueueOrdered(t, b.pool, "k-2", "k")
	enqueue(t, b.pool, "plain", "webhook", map[string]int{"n": 1})

	got := claimRows(t, r, "webhook")
	require.ElementsMatch(t, []string{"k-1", "plain"}, claimedKeys(got))
	for _, row := range got {
		if row.key == "k-1" {
			o := r.decide(r.instances["webhook"], row, nil, connectors.Permanent(errors.New("422")), clock.Now())
			o.started = row.claimedAt
			r.writeOutcomes(ctx, []outcome{o}) // k-1 dead: k-2 may go
		}
		r.done(r.instances["webhook"], row)
	}

	// A replay of k-1 under way: the next claim round waits for it.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, replaylock.ReplaySQL, []int64{head.ID})
	require.NoError(t, err)
	claimed := make(chan int, 1)
	go func() {
		n, _, _, _, err := r.claimRound(ctx, nil, false)
		if err != nil {
			n = -1
		}
		claimed <- n
	}()
	waitAdvisory(t, b, claimed)
	require.Zero(t, len(claimed), "the claim round went on during the replay")
	_, err = tx.Exec(ctx, `UPDATE outbox SET status = 'pending' WHERE id = $1`, head.ID) // the replay
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, <-claimed)
	require.Equal(t, "k-1", (<-r.instances["webhook"].jobs).key, "the round sees the replay: the replayed row goes first")

	// A claim round under way: a replay of a row with an ordering key waits for it; one
	// of rows without waits for nothing.
	round := holdClaimRound(t, b)
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = 'dead' WHERE idempotency_key IN ('k-1', 'plain')`)
	require.NoError(t, err)
	res, err := ops.Replay(ctx, b.pool, ops.Selection{Keys: []string{"plain"}}, ops.ReplayOptions{Actor: "op"})
	require.NoError(t, err)
	require.Equal(t, []string{"plain"}, res.Replayed, "no ordering key: no wait")
	replayed := replayInBackground(t, b, ops.ReplayOptions{}, "k-1")
	waitAdvisory(t, b, replayed)
	require.Zero(t, len(replayed), "the replay went on during the claim round")
	require.NoError(t, round.Commit(ctx))
	require.NoError(t, (<-replayed).err)
	in, err := outbox.Get(ctx, b.pool, "k-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
}

// stallAt blocks the client of a pool before it sends a statement containing at, once
// armed, until resume is closed: a process suspended, or a network gone, mid-transaction.
type stallAt struct {
	at      string
	armed   atomic.Bool
	stalled chan struct{} // closed when it stalls
	resume  chan struct{}
}

func (s *stallAt) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, s.at) && s.armed.CompareAndSwap(true, false) {
		close(s.stalled)
		<-s.resume
	}
	return ctx
}

func (s *stallAt) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// While a replay holds the lock, no relay claims a row (nor records the outcomes that
// ride with its claims). A replay whose client stalled in its batch's transaction (an
// operator's laptop asleep, a network gone) kept it until the server noticed the session
// was gone, which with TCP keepalive's defaults takes hours: every relay stood still
// meanwhile. Its session is now ended once it idles in the transaction for a few seconds.
func TestStalledReplayDoesNotStopClaims(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	deadHead(t, b)

	stall := &stallAt{at: "FOR UPDATE OF o SKIP LOCKED", stalled: make(chan struct{}), resume: make(chan struct{})}
	resume := sync.OnceFunc(func() { close(stall.resume) })
	defer resume()
	pc := b.pool.Config()
	pc.ConnConfig.Tracer = stall
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	stall.armed.Store(true)
	replayed := make(chan error, 1)
	go func() {
		_, err := ops.Replay(ctx, pool, ops.Selection{Keys: []string{"k-1"}}, ops.ReplayOptions{Actor: "op"})
		replayed <- err
	}()
	<-stall.stalled // the replay holds the lock, and its client stands still

	_, _, _, _, err = r.claimRound(ctx, nil, false)
	require.NoError(t, err, "the claim round waited for the stalled replay until it gave up")
	require.Equal(t, "k-2", (<-r.instances["webhook"].jobs).key)
	resume()
	require.Error(t, <-replayed, "the replay's session was ended")
	in, err := outbox.Get(ctx, b.pool, "k-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDead, in.Status, "nothing of the batch committed")
}

// A replay that waits for the lock holds off every claim round that asks for it after
// it (PostgreSQL queues them behind it). A round that stood still while holding the lock
// shared (its relay's process frozen while the database sent it a large batch, or waiting
// for a row behind a pooler whose client was gone) kept the replay waiting, and with it
// every relay, for as long as it lasted. The replay now gives up after a few seconds,
// and the relays go on.
func TestReplayWaitingBehindAStuckRoundGivesUp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	deadHead(t, b)

	holdClaimRound(t, b) // a round that never ends
	replayed := replayInBackground(t, b, ops.ReplayOptions{}, "k-1")
	waitAdvisory(t, b, replayed)

	_, _, _, _, err := r.claimRound(ctx, nil, false)
	require.NoError(t, err, "the claim round waited behind the replay until it gave up")
	require.Equal(t, "k-2", (<-r.instances["webhook"].jobs).key)
	require.ErrorContains(t, (<-replayed).err, "lock timeout")
}

// A dry run of a replay changes nothing, so it neither waits for claim rounds under way
// nor holds off new ones.
func TestDryRunReplayDoesNotWaitForClaimRounds(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	deadHead(t, b)
	holdClaimRound(t, b)

	done := replayInBackground(t, b, ops.ReplayOptions{DryRun: true}, "k-1")
	waitAdvisory(t, b, done)
	require.Len(t, done, 1, "the dry run waits for the claim round")
	got := <-done
	require.NoError(t, got.err)
	require.Len(t, got.res.Replayed, 1, "replayed in the dry run")
}
