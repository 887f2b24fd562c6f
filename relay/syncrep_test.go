package relay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/pgcluster"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// syncRepSetup starts a private cluster with a synchronous standby that never comes
// (synchronous_standby_names names none that exists): a commit by a session with
// synchronous_commit on is flushed locally and then waits for that standby, for ever,
// the transaction not yet visible to others. Ended then (pg_terminate_backend, a fast
// shutdown, a failover's demotion), the session sends a WARNING ("the transaction has
// already committed locally") and closes the connection, sending no error: the client
// sees the connection drop, and the transaction is committed. This is the commit whose
// reply is lost, made by a real server at a moment the test chooses. The test's pool
// commits locally; the relay's pool commits locally too, but for the sessions it opens
// while syncOn is set.
func syncRepSetup(t *testing.T) (direct, relayPool *pgxpool.Pool, syncOn *atomic.Bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{ExtraSettings: map[string]string{
		"synchronous_standby_names": "nobody",
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cluster.Stop()) })
	local := func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "local"
	}
	cfg, err := pgxpool.ParseConfig(cluster.URL("postgres"))
	require.NoError(t, err)
	local(cfg)
	direct, err = pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	_, err = outboxd.Migrate(t.Context(), direct)
	require.NoError(t, err)

	syncOn = &atomic.Bool{}
	cfg, err = pgxpool.ParseConfig(cluster.URL("postgres"))
	require.NoError(t, err)
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.RuntimeParams["synchronous_commit"] = map[bool]string{false: "local", true: "on"}[syncOn.Load()]
		return nil
	}
	relayPool, err = pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)
	return direct, relayPool, syncOn
}

// endCommittedRound waits for a round of the relay (its claims, or the write of its
// outcomes) whose commit waits for the synchronous standby, lets the relay's next
// sessions commit locally, and ends the waiting session: its transaction is committed,
// and the relay sees its connection drop.
func endCommittedRound(t *testing.T, direct, relayPool *pgxpool.Pool, syncOn *atomic.Bool) {
	t.Helper()
	var pid int32
	require.Eventually(t, func() bool {
		err := direct.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity
			WHERE wait_event = 'SyncRep' AND (query LIKE '%WITH due AS%' OR query LIKE '%INSERT INTO outbox_attempts%')
			ORDER BY backend_start LIMIT 1`).Scan(&pid)
		return err == nil
	}, waitTimeout, 5*time.Millisecond, "a round of the relay waits for the synchronous standby")
	syncOn.Store(false)
	relayPool.Reset() // the sessions opened from now on commit locally
	var ended bool
	require.NoError(t, direct.QueryRow(t.Context(), `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ended))
	require.True(t, ended)
}

// The relay's claim round (or, should the row's claim come first, the round that writes
// its outcome) is ended by the server while its commit waits for a synchronous standby:
// the transaction is committed, and the relay only sees its connection drop. A row
// claimed then was never sent: it is handed back and sent as its first attempt, not left
// leased until its lease (3s) expires and put back as an ambiguous attempt, held for an
// operator by the hold policy; an outcome written then is logged once.
func TestClaimRoundEndedWhileItsCommitWaitsForAStandby(t *testing.T) {
	t.Parallel()
	direct, relayPool, syncOn := syncRepSetup(t)
	rcv, err := receiver.Start(receiver.Options{IgnoreKeys: true})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Forwarded, Timeout: 2 * time.Second})
	require.NoError(t, err)
	r, _ := start(t, relayPool, &Config{ID: "syncrep", PollInterval: 50 * time.Millisecond, Lease: 3 * time.Second,
		Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: hook, OnAmbiguous: AmbiguousHold}})
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)

	syncOn.Store(true)
	relayPool.Reset()
	enqueue(t, direct, "claimed-then-ended", "webhook", map[string]int{"n": 1})
	endCommittedRound(t, direct, relayPool, syncOn)

	var in outbox.Intent
	require.Eventually(t, func() bool {
		in, err = outbox.Get(t.Context(), direct, "claimed-then-ended")
		require.NoError(t, err)
		return in.Status != outbox.StatusPending && in.Status != outbox.StatusDelivering
	}, waitTimeout, 10*time.Millisecond)
	require.Equal(t, outbox.StatusDelivered, in.Status, "last error: %s", in.LastError)
	require.Equal(t, 1, in.Attempts, "the claim whose commit was not acknowledged was handed back uncounted")
	require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: "syncrep"}}, attemptsOf(t, direct, "claimed-then-ended"))
	require.Equal(t, 1, rcv.Requests("claimed-then-ended"))
}

// The relay's write of an outcome is ended by the server while its commit waits for a
// synchronous standby: the outcome is committed, and the relay only sees its connection
// drop. It writes the outcome again, not knowing, and the attempt is logged once.
func TestOutcomeRoundEndedWhileItsCommitWaitsForAStandby(t *testing.T) {
	t.Parallel()
	direct, relayPool, syncOn := syncRepSetup(t)
	arrived, release, hold := holdEffect("written-then-ended")
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(e receiver.Effect) { hold(e.Key) }})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	t.Cleanup(func() { closeOnce(release) })
	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced, Timeout: waitTimeout})
	require.NoError(t, err)
	start(t, relayPool, &Config{ID: "syncrep", PollInterval: 50 * time.Millisecond, Lease: waitTimeout + 10*time.Second,
		Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: hook}})

	enqueue(t, direct, "written-then-ended", "webhook", map[string]int{"n": 1})
	waitFor(t, arrived, "the relay never delivered")
	syncOn.Store(true)
	relayPool.Reset()
	closeOnce(release)
	endCommittedRound(t, direct, relayPool, syncOn)

	waitStatus(t, direct, "written-then-ended", outbox.StatusDelivered)
	// The outcome the relay still holds is written no later than the next one.
	enqueue(t, direct, "after", "webhook", map[string]int{"n": 2})
	waitStatus(t, direct, "after", outbox.StatusDelivered)
	require.Eventually(t, func() bool { return len(attemptsOf(t, direct, "after")) > 0 }, waitTimeout, 10*time.Millisecond)

	require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: "syncrep"}}, attemptsOf(t, direct, "written-then-ended"),
		"the attempt is logged once")
	require.Equal(t, 1, rcv.Requests("written-then-ended"))
}
