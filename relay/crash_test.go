package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/internal/slacktest"
	"github.com/outboxd/outboxd/outbox"
)

// childEnv makes the test binary run as a relay process (see runChild), so the crash test
// can kill a real process with SIGKILL.
const childEnv = "OUTBOX_TEST_RELAY_CHILD"

// childAheadEnv sets how far ahead of the real clock the child relay's clock runs: a
// relay started after the first one's lease has run out, without the test waiting for it.
const childAheadEnv = "OUTBOX_TEST_CHILD_AHEAD"

// childLease is the child relay's lease, and a little more than its webhook's time
// limit: the held request stays open from its arrival until the test kills the child,
// which a busy machine may take seconds to do. With a lease of 2s (and so an attempt cut
// at 2s), a child killed later than that had already recorded the attempt as timed out,
// or taken its own expired lease back, and the test failed.
const childLease = time.Hour + 20*time.Second

// childKindEnv picks the child relay's one connector instance: unset, an enforced
// webhook named "webhook"; childHold, a forwarded webhook named "webhook" with the hold
// policy; childSlack, a slack connector named "slack" whose Web API root is
// OUTBOX_TEST_CHILD_URL.
const childKindEnv = "OUTBOX_TEST_CHILD_KIND"

const (
	childHold  = "hold"
	childSlack = "slack"
)

// childConcurrencyEnv sets the child relay's Config.Concurrency, the default when unset.
const childConcurrencyEnv = "OUTBOX_TEST_CHILD_CONCURRENCY"

// runChild runs a relay against OUTBOX_TEST_CHILD_DSN delivering to
// OUTBOX_TEST_CHILD_URL until it is killed or gets SIGTERM, on a clock
// OUTBOX_TEST_CHILD_AHEAD ahead of the real one when that is set, with the instance
// childKindEnv names.
func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("OUTBOX_TEST_CHILD_DSN"))
	if err != nil {
		return 1
	}
	defer pool.Close()
	instances, err := childInstances(os.Getenv(childKindEnv), os.Getenv("OUTBOX_TEST_CHILD_URL"))
	if err != nil {
		return 1
	}
	cfg := &Config{ID: "child", Lease: childLease, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	if n := os.Getenv(childConcurrencyEnv); n != "" {
		if cfg.Concurrency, err = strconv.Atoi(n); err != nil {
			return 1
		}
	}
	if ahead := os.Getenv(childAheadEnv); ahead != "" {
		d, err := time.ParseDuration(ahead)
		if err != nil {
			return 1
		}
		cfg.NowFunc = func() time.Time { return time.Now().Add(d) }
	}
	r, err := New(pool, cfg, instances)
	if err != nil {
		return 1
	}
	if err := r.Run(ctx); err != nil {
		return 1
	}
	return 0
}

// childInstances is the child relay's instance of kind (see childKindEnv), delivering
// to url. Its attempts' time limit is an hour, below childLease: a held request stays
// open until the test kills the child.
func childInstances(kind, url string) (map[string]Instance, error) {
	switch kind {
	case "":
		hook, err := webhook.New(webhook.Config{URL: url, Guarantee: connectors.Enforced, Timeout: time.Hour})
		return map[string]Instance{"webhook": {Connector: hook}}, err
	case childHold:
		hook, err := webhook.New(webhook.Config{URL: url, Guarantee: connectors.Forwarded, Timeout: time.Hour})
		return map[string]Instance{"webhook": {Connector: hook, OnAmbiguous: AmbiguousHold}}, err
	case childSlack:
		c, err := slack.New(slack.Config{Token: slacktest.Token, APIBase: url, Timeout: time.Hour})
		return map[string]Instance{"slack": {Connector: c}}, err
	}
	return nil, fmt.Errorf("unknown child kind %q", kind)
}

// childDB returns a fresh database's URL, for a relay process to connect to, and a pool
// on it for the test.
func childDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dsn := pgtest.URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return dsn, pool
}

// requireNothingRecorded checks that a relay killed while the receiver held key's answer
// recorded nothing: the row is still delivering under the dead relay's lease, and no
// attempt is logged.
func requireNothingRecorded(t *testing.T, pool *pgxpool.Pool, key string) {
	t.Helper()
	in, err := outbox.Get(t.Context(), pool, key)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "the dead relay's lease is still on the row")
	require.Empty(t, attemptsOf(t, pool, key), "no outcome was recorded")
}

// holdEffect returns what holds the receiver's answer to key until the relay is dead:
// hold, to call with each effect's key (a receiver's OnEffect), closes arrived when key's
// effect begins and waits for release. The test closes release (closeOnce), also in a
// cleanup registered after the receiver's, so that it runs before the receiver's Close,
// which waits for the held request.
func holdEffect(key string) (arrived, release chan struct{}, hold func(string)) {
	arrived, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	return arrived, release, func(k string) {
		if k == key {
			once.Do(func() { close(arrived) })
			<-release
		}
	}
}

// The failure that matters most, with a real process: the relay is killed (SIGKILL) after
// the receiver performed the write but before the outcome was recorded. The receiver
// holds its answer until the process is dead, so the relay cannot have recorded it, and
// the test checks that nothing was. The process is then started again, under the same
// relay id as a fixed OUTBOX_RELAY_ID gives it: once the lease expires, it sends the row
// again with the same key, and there is still exactly one effect.
func TestRelayKilledAfterEffectBeforeRecord(t *testing.T) {
	t.Parallel()
	arrived, release, hold := holdEffect("charge-once")
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(e receiver.Effect) { hold(e.Key) }})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	// The receiver behind a front that tells when the held request has been answered
	// (its answer stored): the restarted relay's request, sent before, would find the key
	// still in flight and get a 409.
	target, answered := answeredFront(t, rcv, "charge-once")
	t.Cleanup(func() { closeOnce(release) }) // before the front's Close, which waits for the held request
	dsn, pool := childDB(t)
	child := startRelayChild(t, dsn, target)

	enqueue(t, pool, "charge-once", "webhook", map[string]int{"amount": 500})
	waitFor(t, arrived, "the child relay never delivered")
	// The receiver has performed the effect; the relay has not seen the answer.
	child.kill(t)
	closeOnce(release)
	waitFor(t, answered, "the receiver never answered the dead relay's request")

	requireNothingRecorded(t, pool, "charge-once")
	require.Equal(t, 1, rcv.Effects("charge-once"))

	// The relay comes back after the lease has expired (on its clock, ahead by more than
	// the lease); it takes the row, and the receiver answers from its store: still one
	// effect.
	child = startRelayChild(t, dsn, target, childAheadEnv+"="+(childLease+time.Hour).String())
	in := waitStatus(t, pool, "charge-once", outbox.StatusDelivered)
	require.Equal(t, 1, rcv.Effects("charge-once"))
	require.Equal(t, 2, rcv.Requests("charge-once"), "the retry reached the receiver, which answered from its store")
	require.Equal(t, 2, in.Attempts)
	att := attemptsOf(t, pool, "charge-once")
	require.Len(t, att, 2)
	require.Equal(t, attemptRow{Attempt: 1, Outcome: "lease_expired", Ambiguous: true, Error: "lease expired before the outcome was recorded", RelayID: "child"}, att[0])
	require.Equal(t, attemptRow{Attempt: 2, Outcome: "delivered", RelayID: "child"}, att[1])

	// And it stops cleanly.
	child.stop(t)
}

// PostgreSQL restarts under a running relay, mid-delivery: requests are out at the
// receiver, which holds their answers until the server has gone down, so the relay has
// outcomes in hand while the database is away, rows claimed behind them, and rows still
// pending. It rides the restart out, nothing is lost or sent twice, and delivery resumes
// by itself.
func TestSurvivesPostgresRestart(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Cluster(t)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = outboxd.Migrate(ctx, pool)
	require.NoError(t, err)
	// Every request is an effect: a row sent again (its outcome lost with the connection,
	// and the row retried when its lease expired) would show as a second one. The first
	// inFlight effects wait for release before they are answered.
	const inFlight = 8
	var (
		effects atomic.Int32
		allIn   = make(chan struct{})
		release = make(chan struct{})
	)
	rcv, err := receiver.Start(receiver.Options{IgnoreKeys: true, OnEffect: func(receiver.Effect) {
		if n := effects.Add(1); n <= inFlight {
			if n == inFlight {
				close(allIn)
			}
			<-release
		}
	}})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	t.Cleanup(func() { closeOnce(release) })

	// The held requests stay open across the restart: their time limit, and the lease
	// above it, must not end them on a busy machine (a second attempt, hence a second
	// effect, that this test would take for a lost outcome).
	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced, Timeout: waitTimeout})
	require.NoError(t, err)
	start(t, pool, &Config{PollInterval: 50 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Lease: waitTimeout + 5*time.Second, Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: hook}})

	enqueueN := func(prefix string, n int) {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Key: outbox.Key(prefix, strconv.Itoa(i)), Connector: "webhook", Payload: []int{i}}
		}
		require.Eventually(t, func() bool {
			_, err := outbox.EnqueueBatch(ctx, pool, msgs)
			return err == nil
		}, waitTimeout, 50*time.Millisecond)
	}
	enqueueN("before", 300)
	select {
	case <-allIn:
	case <-time.After(waitTimeout):
		t.Fatalf("the relay never had %d deliveries in flight", inFlight)
	}
	var delivering, pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'delivering'), count(*) FILTER (WHERE status = 'pending')
		FROM outbox`).Scan(&delivering, &pending))
	require.GreaterOrEqual(t, delivering, inFlight, "the held deliveries are in flight when PostgreSQL goes down")
	require.Positive(t, delivering+pending-inFlight, "rows wait behind them")

	// Restart the server, and let the held answers go once it refuses connections (or,
	// on a machine too busy to see it down, once it is back).
	restarted := make(chan error, 1)
	go func() { restarted <- cluster.Restart(ctx) }()
	for down := false; !down; {
		select {
		case err := <-restarted:
			restarted <- err
			down = true
		default:
			conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
			if down = err != nil; !down {
				_ = conn.Close(ctx)
			}
		}
	}
	closeOnce(release)
	require.NoError(t, <-restarted)
	enqueueN("after", 300)

	require.Eventually(t, func() bool {
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status = 'delivered'`).Scan(&n) == nil && n == 600
	}, waitTimeout, 20*time.Millisecond)
	require.Equal(t, 600, rcv.TotalEffects(), "every row sent once: the outcomes in hand when PostgreSQL went away were written after")
	require.Empty(t, rcv.DuplicateKeys())
	var attempts, ambiguous int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE ambiguous) FROM outbox_attempts`).Scan(&attempts, &ambiguous))
	require.Equal(t, 600, attempts, "one attempt logged a row, none lost and none twice")
	require.Zero(t, ambiguous)
}
