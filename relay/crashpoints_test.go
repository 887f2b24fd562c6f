package relay

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/internal/replaylock"
	"github.com/outboxd/outboxd/internal/slacktest"
	"github.com/outboxd/outboxd/outbox"
)

// Where a relay process can die while it delivers a row, and what the database then
// holds for the relay that comes next. A round of claims and outcomes that reached
// PostgreSQL whole may still commit after the process died (PostgreSQL runs what it
// received until it finds its client gone). A claim round's transaction that did not
// commit is rolled back (the row stays pending, as if never claimed); one that did
// leaves the row delivering under the dead relay's lease with the attempt counted. From
// then until the outcome's round commits (the row with a worker or waiting for one, its
// request not sent, partly written, written while the receiver acts, its answer read and
// its outcome queued, that round in flight), the row is the same: delivering, leased,
// and nothing in the attempts log, so every one of those points is handled alike: once
// the lease expires the next relay logs the attempt as lease_expired and ambiguous, and
// the row's connector decides (enforced: sent again with the same key; reconciled:
// looked for first; forwarded with the hold policy: held). An outcome's round that
// committed left the row finished or rescheduled, as a relay that lived on would have;
// a hand-back at stop that committed left the row pending with the attempt uncounted.
// The tests below kill a real relay process (SIGKILL) at those points.

// relayChild is a relay process started by startRelayChild.
type relayChild struct {
	cmd    *exec.Cmd
	exited chan error // gets Wait's error once, put back by whoever reads it
}

// startRelayChild starts the test binary as a relay process (see runChild) against dsn,
// delivering to url, with environ added to its environment. Cleanup kills it.
func startRelayChild(t *testing.T, dsn, url string, environ ...string) *relayChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "OUTBOX_TEST_CHILD_DSN="+dsn, "OUTBOX_TEST_CHILD_URL="+url)
	cmd.Env = append(cmd.Env, environ...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	c := &relayChild{cmd: cmd, exited: make(chan error, 1)}
	go func() { c.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		c.exited <- <-c.exited
	})
	return c
}

// kill kills the child with SIGKILL and waits until it is dead.
func (c *relayChild) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case err := <-c.exited:
		c.exited <- err
		require.Equal(t, syscall.SIGKILL, c.cmd.ProcessState.Sys().(syscall.WaitStatus).Signal(), "the child died of the SIGKILL: %v", err)
	case <-time.After(waitTimeout):
		t.Fatal("the child did not die of SIGKILL")
	}
}

// stop asks the child to stop (SIGTERM) and checks that it exits 0.
func (c *relayChild) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-c.exited:
		c.exited <- err
		require.NoError(t, err, "the child exits 0 on SIGTERM")
	case <-time.After(waitTimeout):
		t.Fatal("the child did not stop on SIGTERM")
	}
}

// leasedTo reports how many of keys are delivering under relay owner's lease, and how
// many are pending and never attempted.
func leasedTo(t *testing.T, pool *pgxpool.Pool, owner string, keys []string) (leased, unattempted int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT
		count(*) FILTER (WHERE status = 'delivering' AND lease_owner = $1),
		count(*) FILTER (WHERE status = 'pending' AND attempts = 0)
		FROM outbox WHERE idempotency_key = ANY($2)`, owner, keys).Scan(&leased, &unattempted))
	return leased, unattempted
}

// successor starts, in this process, the relay that comes after a killed child: another
// relay (id "successor") on a clock ahead of the child's lease, so that it puts the dead
// child's rows back at once.
func successor(t *testing.T, pool *pgxpool.Pool, instances map[string]Instance) {
	t.Helper()
	ahead := childLease + time.Hour
	start(t, pool, &Config{ID: "successor", PollInterval: 50 * time.Millisecond, Lease: time.Minute,
		NowFunc: func() time.Time { return time.Now().Add(ahead) }, Registerer: prometheus.NewRegistry(), Logger: testLogger()}, instances)
}

// A forwarded connector with the hold policy, whose receiver does not dedupe: the relay
// process is killed after the receiver performed the write and before the outcome was
// recorded. Another relay, once the lease has expired, holds the row for an operator and
// sends nothing: one effect, one request, and the attempts log says the dead relay's
// attempt was ambiguous.
func TestRelayKilledAfterEffectHoldsAForwardedRow(t *testing.T) {
	t.Parallel()
	arrived, release, hold := holdEffect("post-once")
	rcv, err := receiver.Start(receiver.Options{IgnoreKeys: true, OnEffect: func(e receiver.Effect) { hold(e.Key) }})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	t.Cleanup(func() { closeOnce(release) })
	dsn, pool := childDB(t)

	child := startRelayChild(t, dsn, rcv.URL(), childKindEnv+"="+childHold)
	enqueue(t, pool, "post-once", "webhook", map[string]int{"n": 1})
	waitFor(t, arrived, "the child relay never delivered")
	child.kill(t)
	closeOnce(release)
	requireNothingRecorded(t, pool, "post-once")

	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Forwarded})
	require.NoError(t, err)
	successor(t, pool, map[string]Instance{"webhook": {Connector: hook, OnAmbiguous: AmbiguousHold}})
	in := waitStatus(t, pool, "post-once", outbox.StatusHeld)
	require.Equal(t, 1, in.Attempts)
	require.Contains(t, in.LastError, "relay child lost its lease during attempt 1")
	require.Contains(t, in.LastError, "held for an operator")
	require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "lease_expired", Ambiguous: true, Error: "lease expired before the outcome was recorded", RelayID: "child"}},
		attemptsOf(t, pool, "post-once"))
	require.Equal(t, 1, rcv.Effects("post-once"))
	require.Equal(t, 1, rcv.Requests("post-once"), "the held row was not sent again")
}

// An enforced connector, the relay process killed with one row's request at the
// receiver, which has read its headers and not acted on it, and rows claimed behind it
// waiting for the one worker. The same relay, started again once the
// lease has expired, logs each abandoned attempt as ambiguous (it cannot know that
// none reached the receiver) and sends every row again: one effect each. A waiting row
// that was handed back before the kill (it waited longer than its start bound) has no
// abandoned attempt: one attempt, delivered.
func TestRelayKilledWithARequestUnansweredAndRowsWaiting(t *testing.T) {
	t.Parallel()
	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	// In front of the receiver, a listener that reads the first connection's request and
	// never acts on it nor answers; it passes later connections through.
	front := newHalfFront(t, rcv.URL())

	dsn, pool := childDB(t)

	child := startRelayChild(t, dsn, front.url+"/hook", childConcurrencyEnv+"=1")
	keys := []string{"row-1", "row-2", "row-3", "row-4"}
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = outbox.Message{Key: k, Connector: "webhook", Payload: map[string]int{"n": i}}
	}
	_, err = outbox.EnqueueBatch(t.Context(), pool, msgs)
	require.NoError(t, err)
	waitFor(t, front.held, "the child relay never sent a request")
	// Every row is claimed (one sent, the others claimed ahead for the one worker) when
	// the first request's headers arrive, or very soon after.
	require.Eventually(t, func() bool {
		leased, unattempted := leasedTo(t, pool, "child", keys)
		return leased+unattempted == len(keys) && leased >= 1
	}, waitTimeout, 5*time.Millisecond)
	child.kill(t)
	front.cut()

	halfKey := front.key()
	require.Contains(t, keys, halfKey, "the held request carried a row's key")
	abandoned := map[string]bool{}
	for _, k := range keys {
		in, err := outbox.Get(t.Context(), pool, k)
		require.NoError(t, err)
		switch in.Status {
		case outbox.StatusDelivering:
			abandoned[k] = true
			require.Equal(t, 1, in.Attempts)
		case outbox.StatusPending:
			require.Zero(t, in.Attempts, "%s handed back uncounted", k)
		default:
			t.Fatalf("%s is %s after the kill", k, in.Status)
		}
		require.Empty(t, attemptsOf(t, pool, k), "no outcome was recorded for %s", k)
		require.Zero(t, rcv.Requests(k), "nothing reached the receiver for %s", k)
	}
	require.True(t, abandoned[halfKey], "the row whose request is out is still leased")
	t.Logf("rows abandoned in flight or waiting: %d of %d", len(abandoned), len(keys))

	child = startRelayChild(t, dsn, front.url+"/hook", childAheadEnv+"="+(childLease+time.Hour).String())
	for _, k := range keys {
		in := waitStatus(t, pool, k, outbox.StatusDelivered)
		require.Equal(t, 1, rcv.Effects(k), k)
		// The receiver enforces keys, so effects alone cannot show a row sent twice: no
		// request of the killed relay reached it, so the successor's is the only one.
		require.Equal(t, 1, rcv.Requests(k), "%s: requests that reached the receiver", k)
		att := attemptsOf(t, pool, k)
		if abandoned[k] {
			require.Equal(t, 2, in.Attempts, k)
			require.Equal(t, []attemptRow{
				{Attempt: 1, Outcome: "lease_expired", Ambiguous: true, Error: "lease expired before the outcome was recorded", RelayID: "child"},
				{Attempt: 2, Outcome: "delivered", RelayID: "child"},
			}, att, k)
		} else {
			require.Equal(t, 1, in.Attempts, k)
			require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: "child"}}, att, k)
		}
	}
	require.Empty(t, rcv.DuplicateKeys())
	child.stop(t)
}

// A relay process asked to stop (SIGTERM) hands back the rows it had claimed and not
// started, then waits for its delivery in flight; it is killed (SIGKILL) during that
// wait, after the receiver performed the write. The rows handed back were never
// attempted: another relay sends each once, as its first attempt, with no ambiguous
// attempt logged. The row in flight is put back once its lease has expired and sent
// again with the same key: one effect.
func TestRelayKilledWhileStoppingAfterItsHandBack(t *testing.T) {
	t.Parallel()
	arrived, release, hold := holdEffect("draining")
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(e receiver.Effect) { hold(e.Key) }})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	target, answered := answeredFront(t, rcv, "draining")
	t.Cleanup(func() { closeOnce(release) }) // before the front's Close, which waits for the held request
	dsn, pool := childDB(t)

	child := startRelayChild(t, dsn, target, childConcurrencyEnv+"=1")
	enqueue(t, pool, "draining", "webhook", map[string]int{"n": 0})
	waitFor(t, arrived, "the child relay never delivered")
	waiting := []string{"waiting-1", "waiting-2", "waiting-3"}
	for i, k := range waiting {
		enqueue(t, pool, k, "webhook", map[string]int{"n": i + 1})
	}
	// Claimed behind the one worker, which the held request keeps.
	require.Eventually(t, func() bool {
		leased, _ := leasedTo(t, pool, "child", waiting)
		return leased == len(waiting)
	}, waitTimeout, 5*time.Millisecond)

	require.NoError(t, child.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool {
		_, unattempted := leasedTo(t, pool, "child", waiting)
		return unattempted == len(waiting)
	}, waitTimeout, 5*time.Millisecond, "the stopping relay hands back the rows it had not started")
	child.kill(t)
	closeOnce(release)
	waitFor(t, answered, "the receiver never answered the dead relay's request")

	in, err := outbox.Get(t.Context(), pool, "draining")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "the dead relay's lease is still on the row in flight")
	require.Empty(t, attemptsOf(t, pool, "draining"))
	require.Equal(t, 1, rcv.Effects("draining"))

	hook, err := webhook.New(webhook.Config{URL: target, Guarantee: connectors.Enforced})
	require.NoError(t, err)
	successor(t, pool, map[string]Instance{"webhook": {Connector: hook}})
	for _, k := range waiting {
		in := waitStatus(t, pool, k, outbox.StatusDelivered)
		require.Equal(t, 1, in.Attempts, k)
		require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: "successor"}}, attemptsOf(t, pool, k), k)
		require.Equal(t, 1, rcv.Effects(k), k)
	}
	in = waitStatus(t, pool, "draining", outbox.StatusDelivered)
	require.Equal(t, 2, in.Attempts)
	require.Equal(t, []attemptRow{
		{Attempt: 1, Outcome: "lease_expired", Ambiguous: true, Error: "lease expired before the outcome was recorded", RelayID: "child"},
		{Attempt: 2, Outcome: "delivered", RelayID: "successor"},
	}, attemptsOf(t, pool, "draining"))
	require.Equal(t, 1, rcv.Effects("draining"))
	require.Equal(t, 2, rcv.Requests("draining"), "the retry reached the receiver, which answered from its store")
}

// waitingOnLock waits until some session of the test's database other than the
// pool's waits for a lock of the kind event names (pg_stat_activity's wait_event:
// "advisory", "transactionid", ...).
func waitingOnLock(t *testing.T, pool *pgxpool.Pool, event string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = $1`, event).Scan(&n)
		return err == nil && n > 0
	}, waitTimeout, 5*time.Millisecond, "no session waits for a lock (%s)", event)
}

// A claim round sent when the relay process died: it waits for the lock a replay holds
// (see internal/replaylock) when the process is killed. PostgreSQL runs it to its end
// once the lock is free, its client gone, unless its session is ended first.
//
// Committed, the round leases the row to a relay that will never see it. Once the lease
// has expired, another relay cannot know the row was never sent, logs the attempt as
// ambiguous and, the connector being forwarded with the hold policy, holds the row for
// an operator: nothing is sent blindly (here, nothing at all).
//
// Rolled back, the round leaves the row as it was: pending and never attempted. Another
// relay sends it once, as its first attempt, with no ambiguous attempt logged.
func TestRelayKilledWithAClaimRoundInFlight(t *testing.T) {
	t.Parallel()
	type testBundle struct {
		rcv  *receiver.Receiver
		pool *pgxpool.Pool
	}
	// setup kills a relay process whose claim round waits for the replay lock, with the
	// row it is to claim, and returns once the round's session has ended (killed when
	// terminate is set, else run to its end).
	setup := func(t *testing.T, terminate bool) *testBundle {
		t.Helper()
		rcv, err := receiver.Start(receiver.Options{IgnoreKeys: true})
		require.NoError(t, err)
		t.Cleanup(rcv.Close)
		dsn, pool := childDB(t)

		child := startRelayChild(t, dsn, rcv.URL(), childKindEnv+"="+childHold)
		// A row with an ordering key, for the replay lock below.
		warm, err := outbox.Enqueue(t.Context(), pool, outbox.Message{Key: "warm-up", Connector: "webhook", Payload: []int{0}, OrderingKey: "warm"})
		require.NoError(t, err)
		waitStatus(t, pool, "warm-up", outbox.StatusDelivered)

		// Hold the replay lock, as a replay of that row does: the child's claim rounds,
		// which poll every 50ms, wait for it. The rounds that do began after asked.
		asked := time.Now()
		tx, err := pool.Begin(t.Context())
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) })
		_, err = tx.Exec(t.Context(), replaylock.ReplaySQL, []int64{warm.ID})
		require.NoError(t, err)
		// Due before the waiting round began (its claim takes only rows due by its
		// start), and not so long before that its claim, which starts its scan a few
		// seconds before the row the last claim took (warm-up), passes over it.
		_, err = outbox.Enqueue(t.Context(), pool, outbox.Message{Key: "claimed-dead", Connector: "webhook", Payload: []int{1},
			NotBefore: asked.Add(-time.Second)})
		require.NoError(t, err)
		waitingOnLock(t, pool, "advisory")
		child.kill(t)
		if terminate {
			_, err = pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit(t.Context()))
		require.Eventually(t, func() bool {
			var n int
			err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n)
			return err == nil && n == 0
		}, waitTimeout, 5*time.Millisecond, "the round's session never stopped waiting")
		return &testBundle{rcv: rcv, pool: pool}
	}
	// successorHolds starts another relay with the hold policy.
	successorHolds := func(t *testing.T, b *testBundle) {
		t.Helper()
		hook, err := webhook.New(webhook.Config{URL: b.rcv.URL(), Guarantee: connectors.Forwarded})
		require.NoError(t, err)
		successor(t, b.pool, map[string]Instance{"webhook": {Connector: hook, OnAmbiguous: AmbiguousHold}})
	}

	t.Run("CommittedAfterTheRelayDied", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		// The dead relay's round takes the row once the lock is free.
		require.Eventually(t, func() bool {
			leased, _ := leasedTo(t, b.pool, "child", []string{"claimed-dead"})
			return leased == 1
		}, waitTimeout, 5*time.Millisecond, "the round of the dead relay claimed the row")
		require.Empty(t, attemptsOf(t, b.pool, "claimed-dead"))

		successorHolds(t, b)
		in := waitStatus(t, b.pool, "claimed-dead", outbox.StatusHeld)
		require.Equal(t, 1, in.Attempts)
		require.Contains(t, in.LastError, "relay child lost its lease during attempt 1")
		require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "lease_expired", Ambiguous: true, Error: "lease expired before the outcome was recorded", RelayID: "child"}},
			attemptsOf(t, b.pool, "claimed-dead"))
		require.Zero(t, b.rcv.Requests("claimed-dead"), "the held row was not sent")
	})

	t.Run("RolledBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, true)
		in, err := outbox.Get(t.Context(), b.pool, "claimed-dead")
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, in.Status)
		require.Zero(t, in.Attempts)

		successorHolds(t, b)
		in = waitStatus(t, b.pool, "claimed-dead", outbox.StatusDelivered)
		require.Equal(t, 1, in.Attempts)
		require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: "successor"}}, attemptsOf(t, b.pool, "claimed-dead"))
		require.Equal(t, 1, b.rcv.Effects("claimed-dead"))
	})
}

// The outcome of a delivery sent before the relay process died and committed after: the
// round that writes it waits for the row, which another transaction holds, when the
// process is killed, and PostgreSQL runs it to its end once the row is free. The row is
// delivered, and the relay that comes next leaves it alone: one effect, one request.
func TestRelayKilledWithItsOutcomeRoundInFlight(t *testing.T) {
	t.Parallel()
	arrived, release, hold := holdEffect("recorded-dead")
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(e receiver.Effect) { hold(e.Key) }})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	t.Cleanup(func() { closeOnce(release) })
	dsn, pool := childDB(t)

	child := startRelayChild(t, dsn, rcv.URL())
	enqueue(t, pool, "recorded-dead", "webhook", map[string]int{"n": 1})
	waitFor(t, arrived, "the child relay never delivered")
	// Hold the row: the round that writes its outcome waits for it.
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) })
	_, err = tx.Exec(t.Context(), `SELECT 1 FROM outbox WHERE idempotency_key = 'recorded-dead' FOR UPDATE`)
	require.NoError(t, err)
	closeOnce(release)
	waitingOnLock(t, pool, "transactionid")
	child.kill(t)
	require.NoError(t, tx.Commit(t.Context()))

	in := waitStatus(t, pool, "recorded-dead", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts)
	require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: "child"}}, attemptsOf(t, pool, "recorded-dead"))

	// Another relay delivers a later row and leaves this one as it is.
	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced})
	require.NoError(t, err)
	successor(t, pool, map[string]Instance{"webhook": {Connector: hook}})
	enqueue(t, pool, "later", "webhook", map[string]int{"n": 2})
	waitStatus(t, pool, "later", outbox.StatusDelivered)
	require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: "child"}}, attemptsOf(t, pool, "recorded-dead"))
	require.Equal(t, 1, rcv.Effects("recorded-dead"))
	require.Equal(t, 1, rcv.Requests("recorded-dead"))
}

// answeredFront serves rcv behind a front whose answered is closed once a request for
// key has been answered (its answer stored): a retry sent before would find the key
// still in flight and get a 409, an attempt more.
func answeredFront(t *testing.T, rcv *receiver.Receiver, key string) (url string, answered <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rcv.ServeHTTP(w, req)
		if req.Header.Get("Idempotency-Key") == key {
			once.Do(func() { close(ch) })
		}
	}))
	t.Cleanup(front.Close)
	return front.URL + "/hook", ch
}

// halfFront is a TCP listener in front of an HTTP receiver: it reads the first
// connection's request (see key) and never acts on it nor answers, until cut; it passes
// later connections through to the receiver.
type halfFront struct {
	url  string
	held chan struct{} // closed once the first request's headers are in

	mu      sync.Mutex
	heldKey string
	conns   []net.Conn
}

func newHalfFront(t *testing.T, target string) *halfFront {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &halfFront{url: "http://" + ln.Addr().String(), held: make(chan struct{})}
	u, err := url.Parse(target)
	require.NoError(t, err)
	backend := u.Host
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		f.cut()
		wg.Wait()
	})
	wg.Go(func() {
		first := true
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, conn)
			f.mu.Unlock()
			if first {
				first = false
				wg.Go(func() { f.hold(conn) })
				continue
			}
			wg.Go(func() {
				up, err := net.Dial("tcp", backend)
				if err != nil {
					_ = conn.Close()
					return
				}
				f.mu.Lock()
				f.conns = append(f.conns, up)
				f.mu.Unlock()
				wg.Go(func() { _, _ = io.Copy(up, conn); _ = up.Close() })
				_, _ = io.Copy(conn, up)
				_ = conn.Close()
			})
		}
	})
	return f
}

// hold reads conn's request headers, notes its key and closes held, then reads on
// without acting or answering until the connection ends.
func (f *halfFront) hold(conn net.Conn) {
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err == nil {
		f.mu.Lock()
		f.heldKey = req.Header.Get("Idempotency-Key")
		f.mu.Unlock()
	}
	close(f.held)
	_, _ = io.Copy(io.Discard, br)
}

// key is the idempotency key of the held request.
func (f *halfFront) key() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.heldKey
}

// cut closes every connection the front has.
func (f *halfFront) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
}

// The Slack-like reconciled connector: the relay process is killed after Slack stored
// the message and before the relay read its answer. Another relay, once the lease has
// expired, looks the key up in the channel's history before posting, finds the message
// and records it as delivered: one message, one post.
func TestRelayKilledAfterSlackPostIsReconciled(t *testing.T) {
	t.Parallel()
	arrived, release, hold := holdEffect("announce-once")
	fake := slacktest.Start(t, slacktest.Options{OnPostFunc: hold})
	t.Cleanup(func() { closeOnce(release) })
	dsn, pool := childDB(t)

	child := startRelayChild(t, dsn, fake.APIBase(), childKindEnv+"="+childSlack)
	enqueue(t, pool, "announce-once", "slack", map[string]string{"channel": "C0123", "text": "deployed"})
	waitFor(t, arrived, "the child relay never posted")
	child.kill(t)
	closeOnce(release)
	requireNothingRecorded(t, pool, "announce-once")
	require.Equal(t, 1, fake.Effects("announce-once"))

	c, err := slack.New(slack.Config{Token: slacktest.Token, APIBase: fake.APIBase()})
	require.NoError(t, err)
	successor(t, pool, map[string]Instance{"slack": {Connector: c}})
	in := waitStatus(t, pool, "announce-once", outbox.StatusDelivered)
	require.Equal(t, 2, in.Attempts)
	var res struct {
		TS         string `json:"ts"`
		Reconciled bool   `json:"reconciled"`
	}
	require.NoError(t, json.Unmarshal(in.Result, &res))
	require.True(t, res.Reconciled, "the message was found, not posted again: %s", in.Result)
	require.Equal(t, fake.TS("announce-once"), res.TS)
	require.Equal(t, []attemptRow{
		{Attempt: 1, Outcome: "lease_expired", Ambiguous: true, Error: "lease expired before the outcome was recorded", RelayID: "child"},
		{Attempt: 2, Outcome: "delivered", RelayID: "successor"},
	}, attemptsOf(t, pool, "announce-once"))
	require.Equal(t, 1, fake.Effects("announce-once"))
	require.Equal(t, 1, fake.Posts("announce-once"), "the message was not posted again")
}
