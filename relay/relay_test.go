package relay

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// waitTimeout bounds every wait for the relay to reach a state. Tests never assert on
// how long it took; this only stops a broken test from hanging.
const waitTimeout = 60 * time.Second

// testClock is an injected clock that only moves when a test moves it.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type testBundle struct {
	pool     *pgxpool.Pool
	receiver *receiver.Receiver
	hook     *webhook.Connector
	registry *prometheus.Registry
}

func setup(t *testing.T, opts receiver.Options) *testBundle {
	t.Helper()
	rcv, err := receiver.Start(opts)
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	return &testBundle{
		pool:     pgtest.DB(t),
		receiver: rcv,
		hook:     newHook(t, rcv.URL()),
		registry: prometheus.NewRegistry(),
	}
}

func newHook(t testing.TB, url string) *webhook.Connector {
	t.Helper()
	hook, err := webhook.New(webhook.Config{URL: url, Guarantee: connectors.Enforced, Timeout: 5 * time.Second})
	require.NoError(t, err)
	return hook
}

// newRelay returns a relay with cfg over b's webhook connector, as instance "webhook".
func (b *testBundle) newRelay(t *testing.T, cfg *Config) *Relay {
	t.Helper()
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	r.parkBehindMin = 1 // parked behind any row in flight, so tests need not enqueue 50
	return r
}

// namedRelay is newRelay with a copy of cfg under relay id and a registry of its own,
// for tests that run several relays on one database.
func (b *testBundle) namedRelay(t *testing.T, cfg *Config, id string) *Relay {
	t.Helper()
	c := *cfg
	c.ID, c.Registerer = id, prometheus.NewRegistry()
	return b.newRelay(t, &c)
}

// fastConfig retries within milliseconds, so tests that use the real clock finish fast.
func (b *testBundle) fastConfig() *Config {
	return &Config{
		PollInterval: 50 * time.Millisecond,
		BackoffBase:  time.Millisecond,
		BackoffMax:   10 * time.Millisecond,
		Registerer:   b.registry,
		Logger:       testLogger(),
	}
}

// clockedConfig is fastConfig on an injected clock that starts a minute after the
// database's, so rows stamped now() by the database during the test are due. (A second
// was not enough: on a busy machine running the tests in parallel, a test could take
// longer than that to enqueue its rows, which were then not due and never claimed.)
func (b *testBundle) clockedConfig(t *testing.T) (*testClock, *Config) {
	t.Helper()
	var dbNow time.Time
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT now()`).Scan(&dbNow))
	clock := &testClock{now: dbNow.Add(time.Minute)}
	cfg := b.fastConfig()
	cfg.NowFunc = clock.Now
	return clock, cfg
}

func testLogger() *slog.Logger {
	if os.Getenv("RELAY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start runs a relay until the test ends; the returned stop cancels it and checks that
// Run returned nil.
func start(t *testing.T, pool *pgxpool.Pool, cfg *Config, instances map[string]Instance) (r *Relay, stop func()) {
	t.Helper()
	r, err := New(pool, cfg, instances)
	require.NoError(t, err)
	return r, run(t, r)
}

// run runs r until the test ends, as start does.
func run(t *testing.T, r *Relay) (stop func()) {
	t.Helper()
	signal, stopped := runSignalled(t, r)
	return func() {
		signal()
		stopped()
	}
}

// runSignalled runs r until the test ends, or signal (a SIGTERM) stops it: stopped
// waits for Run to return, nil, within waitTimeout. A test signals, looks at the relay
// stopping, and then waits.
func runSignalled(t *testing.T, r *Relay) (signal, stopped func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stopped = func() {
		once.Do(func() {
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(waitTimeout):
				t.Fatal("relay did not stop")
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		stopped()
	})
	return cancel, stopped
}

// startNotifyOnly runs a relay that polls only hourly, so that only NOTIFY wakes it in
// a test, and returns once its LISTEN connection is up and its NOTIFY self-test passed.
func (b *testBundle) startNotifyOnly(t *testing.T) *Relay {
	t.Helper()
	cfg := b.fastConfig()
	cfg.PollInterval = time.Hour
	cfg.Registerer = prometheus.NewRegistry() // a test may run two
	r := b.newRelay(t, cfg)
	// The self-test runs once per LISTEN connection and says NOTIFY does not reach the
	// relay when its notification takes longer than probeTimeout (5s), the gauge at 0
	// until it comes: on a busy machine the tests below must not depend on a
	// notification arriving that fast.
	r.probeTimeout = waitTimeout
	run(t, r)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond,
		"the NOTIFY self-test passed")
	return r
}

func enqueue(t *testing.T, db outbox.DB, key, connector string, payload any) outbox.Intent {
	t.Helper()
	in, err := outbox.Enqueue(t.Context(), db, outbox.Message{Key: key, Connector: connector, Payload: payload})
	require.NoError(t, err)
	return in
}

// waitStatus waits until the row with key has status, and returns it.
func waitStatus(t *testing.T, pool *pgxpool.Pool, key, status string) outbox.Intent {
	t.Helper()
	return waitStatusWithin(t, pool, key, status, waitTimeout)
}

// waitStatusWithin is waitStatus for at most within.
func waitStatusWithin(t *testing.T, pool *pgxpool.Pool, key, status string, within time.Duration) outbox.Intent {
	t.Helper()
	var (
		mu   sync.Mutex // the condition runs on a goroutine of its own
		last outbox.Intent
	)
	ok := assert.Eventually(t, func() bool {
		in, err := outbox.Get(t.Context(), pool, key)
		if err != nil {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		last = in
		return in.Status == status
	}, within, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if !ok {
		// The row as last read: formatted here, not when the wait began.
		t.Fatalf("row %q never reached %s (last: %+v)", key, status, last)
	}
	return last
}

type attemptRow struct {
	Attempt   int
	Outcome   string
	Ambiguous bool
	Error     string
	RelayID   string
}

func attemptsOf(t *testing.T, pool *pgxpool.Pool, key string) []attemptRow {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT a.attempt, a.outcome, a.ambiguous, coalesce(a.error, ''), a.relay_id
		FROM outbox_attempts a JOIN outbox o ON o.id = a.outbox_id WHERE o.idempotency_key = $1 ORDER BY a.id`, key)
	require.NoError(t, err)
	defer rows.Close()
	var out []attemptRow
	for rows.Next() {
		var a attemptRow
		require.NoError(t, rows.Scan(&a.Attempt, &a.Outcome, &a.Ambiguous, &a.Error, &a.RelayID))
		out = append(out, a)
	}
	require.NoError(t, rows.Err())
	return out
}

func countStatus(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT status, count(*) FROM outbox GROUP BY status`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			s string
			n int
		)
		require.NoError(t, rows.Scan(&s, &n))
		out[s] = n
	}
	return out
}

func TestDeliversOnNotifyWithTraceparent(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	r := b.startNotifyOnly(t)

	trace := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	_, err := outbox.Enqueue(t.Context(), b.pool, outbox.Message{Key: "order-1/notify", Connector: "webhook",
		Payload: map[string]any{"order": 1}, Headers: map[string]string{"traceparent": trace}})
	require.NoError(t, err)

	in := waitStatus(t, b.pool, "order-1/notify", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts)
	var result struct{ Status int }
	require.NoError(t, json.Unmarshal(in.Result, &result))
	require.Equal(t, http.StatusOK, result.Status)

	log := b.receiver.EffectLog()
	require.Len(t, log, 1)
	require.Equal(t, trace, log[0].Headers.Get("traceparent"))
	require.Equal(t, "order-1/notify", log[0].Headers.Get("Idempotency-Key"))
	require.JSONEq(t, `{"order":1}`, string(log[0].Body))
	require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: r.ID()}}, attemptsOf(t, b.pool, "order-1/notify"))

	// A plain SQL insert is delivered the same way.
	_, err = b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('plain', 'webhook', '[1]')`)
	require.NoError(t, err)
	waitStatus(t, b.pool, "plain", outbox.StatusDelivered)
}

// The insert trigger decides whether to NOTIFY when a row is inserted, and the
// notification goes out at COMMIT: a transaction that inserted while a relay's
// fast-polling mark stood sends none, though it commits after the mark lapsed. The relay
// goes on polling fast after its mark lapses (fastPollGrace), and finds that row at once;
// it used to stop as the mark lapsed, and the row waited for its PollInterval (an hour
// here).
func TestRowInsertedUnderTheMarkAndCommittedAfterItLapsedIsFound(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	enqueue(t, b.pool, "first", "webhook", map[string]any{"n": 1}) // found by the relay's first claim
	cfg := b.fastConfig()
	cfg.PollInterval = time.Hour
	r := b.newRelay(t, cfg)
	r.fastGrace = waitTimeout // the lapse and the commit below may be far apart on a busy machine
	run(t, r)
	waitStatus(t, b.pool, "first", outbox.StatusDelivered)

	// The relay's mark, as its fast polling writes it, renewed in the transaction for two
	// seconds from now: the insert after it sees it and sends no NOTIFY, however long
	// this test took to get here. The relay's own fast polling ends before the mark does.
	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	var until time.Time
	require.NoError(t, tx.QueryRow(t.Context(), `UPDATE outbox_wake_connectors SET polling_until = clock_timestamp() + interval '2 seconds'
		WHERE connector = 'webhook' AND relay_id = $1 RETURNING polling_until`, r.ID()).Scan(&until))
	enqueue(t, tx, "second", "webhook", map[string]any{"n": 2})
	require.Eventually(t, func() bool {
		var lapsed bool
		err := b.pool.QueryRow(t.Context(), `SELECT clock_timestamp() > $1`, until).Scan(&lapsed)
		return err == nil && lapsed
	}, waitTimeout, 10*time.Millisecond, "the mark lapses")
	require.NoError(t, tx.Commit(t.Context()))
	waitStatus(t, b.pool, "second", outbox.StatusDelivered)
}

// A relay that claimed rows polls fast and tells the insert trigger so, which then sends
// no NOTIFY. When it stops, it withdraws that mark: a relay left running idle, which
// polls only hourly here, must hear of the next row at once.
func TestStoppedRelayWithdrawsItsFastPollingMark(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, stopFirst := start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	enqueue(t, b.pool, "first", "webhook", map[string]any{"n": 1})
	waitStatus(t, b.pool, "first", outbox.StatusDelivered)
	// The mark the first relay set lapses within seconds; stretched to an hour, only its
	// withdrawal can end it in time.
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox_wake_connectors SET polling_until = now() + interval '1 hour'`)
	require.NoError(t, err)

	idle := b.startNotifyOnly(t)

	stopFirst()
	var marked bool
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT coalesce(bool_or(polling_until > clock_timestamp()), false) FROM outbox_wake_connectors`).Scan(&marked))
	require.False(t, marked, "the stopped relay's fast-polling mark is withdrawn")

	enqueue(t, b.pool, "second", "webhook", map[string]any{"n": 2})
	waitStatus(t, b.pool, "second", outbox.StatusDelivered)
	require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: idle.ID()}}, attemptsOf(t, b.pool, "second"))
}

// The failure that matters most: the receiver performs the write, then the connection
// drops before the relay sees the answer. The retry carries the same key, and the
// receiver's effect count stays 1.
func TestConnectionDropAfterEffectIsNotDuplicated(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	b.receiver.Plan("charge-1", receiver.Plan{DropAfterEffect: 1})
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})

	enqueue(t, b.pool, "charge-1", "webhook", map[string]any{"amount": 100})
	in := waitStatus(t, b.pool, "charge-1", outbox.StatusDelivered)

	require.Equal(t, 1, b.receiver.Effects("charge-1"))
	require.Equal(t, 2, b.receiver.Requests("charge-1"), "the retry reached the receiver, which answered from its store")
	require.Equal(t, 2, in.Attempts)
	att := attemptsOf(t, b.pool, "charge-1")
	require.Len(t, att, 2)
	require.Equal(t, "retry", att[0].Outcome)
	require.True(t, att[0].Ambiguous, "the dropped attempt is recorded as ambiguous")
	require.Equal(t, "delivered", att[1].Outcome)
	for _, e := range b.receiver.EffectLog() {
		require.Equal(t, "charge-1", e.Headers.Get("Idempotency-Key"))
	}
}

func TestFailureClassification(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	b.receiver.Plan("permanent", receiver.Plan{PermanentStatus: http.StatusUnprocessableEntity})
	b.receiver.Plan("flaky", receiver.Plan{FailFirst: 2})
	b.receiver.Plan("hopeless", receiver.Plan{FailFirst: 1000})
	cfg := b.fastConfig()
	cfg.MaxAttempts = 3
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})

	for _, k := range []string{"permanent", "flaky", "hopeless"} {
		enqueue(t, b.pool, k, "webhook", []string{k})
	}

	perm := waitStatus(t, b.pool, "permanent", outbox.StatusDead)
	require.Equal(t, 1, perm.Attempts, "a permanent failure is not retried")
	require.Equal(t, 1, b.receiver.Requests("permanent"), "nor sent again within its one attempt")
	require.Contains(t, perm.LastError, "422")
	require.Contains(t, perm.LastError, "permanent")
	require.Contains(t, string(perm.Result), "422", "the receiver's answer is stored")

	flaky := waitStatus(t, b.pool, "flaky", outbox.StatusDelivered)
	require.Equal(t, 3, flaky.Attempts)
	require.Contains(t, flaky.LastError, "503", "the latest failure stays readable")

	hopeless := waitStatus(t, b.pool, "hopeless", outbox.StatusDead)
	require.Equal(t, 3, hopeless.Attempts)
	require.Contains(t, hopeless.LastError, "gave up after 3 attempts")
	require.Equal(t, 3, b.receiver.Requests("hopeless"), "one request an attempt")
	require.Equal(t, 0, b.receiver.Effects("hopeless"))
}

func TestUnknownConnectorStaysPending(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	enqueue(t, b.pool, "for-crm", "webhook:crm", []int{1})
	r, _ := start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})

	// A row the relay can deliver, enqueued after: once it is delivered, the relay has
	// had its chance at the other one.
	enqueue(t, b.pool, "known", "webhook", []int{2})
	waitStatus(t, b.pool, "known", outbox.StatusDelivered)
	r.reclaim(t.Context())

	in, err := outbox.Get(t.Context(), b.pool, "for-crm")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
	require.Equal(t, 0, in.Attempts)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")) == 1
	}, waitTimeout, 10*time.Millisecond, "reported in outboxd_unknown_connector_rows")
}

// Backoff and Retry-After schedules, checked with an injected clock.
func TestRetrySchedulesWithInjectedClock(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.BackoffBase = 10 * time.Second
	cfg.BackoffMax = time.Hour
	// The connector's clock is the relay's (webhook-timestamp; Retry-After dates when an
	// answer has no Date).
	hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Enforced, NowFunc: clock.Now})
	require.NoError(t, err)
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: hook}})

	// A date on the receiver's clock, five minutes after the Date it answers with.
	answered := clock.Now().UTC().Truncate(time.Second)
	date := answered.Add(5 * time.Minute)
	b.receiver.Plan("backoff", receiver.Plan{FailFirst: 2})
	b.receiver.Plan("retry-after-seconds", receiver.Plan{FailFirst: 1, FailStatus: 429, RetryAfter: "120"})
	b.receiver.Plan("retry-after-date", receiver.Plan{FailFirst: 1, RetryAfter: date.Format(http.TimeFormat), Date: answered.Format(http.TimeFormat)})
	for _, k := range []string{"backoff", "retry-after-seconds", "retry-after-date"} {
		enqueue(t, b.pool, k, "webhook", []string{k})
	}

	waitAttempts := func(key string, n int) outbox.Intent {
		t.Helper()
		var in outbox.Intent
		require.Eventually(t, func() bool {
			var err error
			in, err = outbox.Get(t.Context(), b.pool, key)
			return err == nil && in.Attempts == n && in.Status == outbox.StatusPending
		}, waitTimeout, 10*time.Millisecond)
		return in
	}

	t0 := clock.Now()
	in := waitAttempts("backoff", 1)
	require.WithinRange(t, in.NextAttemptAt, t0.Add(8*time.Second), t0.Add(12*time.Second), "base ±20%")
	in = waitAttempts("retry-after-seconds", 1)
	require.True(t, in.NextAttemptAt.Equal(t0.Add(120*time.Second)), "Retry-After seconds wins: %s", in.NextAttemptAt)
	in = waitAttempts("retry-after-date", 1)
	require.True(t, in.NextAttemptAt.Equal(t0.Add(5*time.Minute)), "Retry-After date wins: %s", in.NextAttemptAt)

	// Nothing is retried before its time: the clock has not moved.
	require.Equal(t, 1, b.receiver.Requests("backoff"))

	clock.Advance(13 * time.Second)
	t1 := clock.Now()
	in = waitAttempts("backoff", 2)
	require.WithinRange(t, in.NextAttemptAt, t1.Add(16*time.Second), t1.Add(24*time.Second), "doubled ±20%")
	require.Equal(t, 1, b.receiver.Requests("retry-after-seconds"), "not due yet")

	clock.Advance(10 * time.Minute)
	waitStatus(t, b.pool, "backoff", outbox.StatusDelivered)
	waitStatus(t, b.pool, "retry-after-seconds", outbox.StatusDelivered)
	waitStatus(t, b.pool, "retry-after-date", outbox.StatusDelivered)
}

func TestMaxAgeSendsToDead(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	b.receiver.Plan("old", receiver.Plan{FailFirst: 1, RetryAfter: "3600"})
	cfg := b.fastConfig()
	cfg.MaxAge = time.Minute
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	enqueue(t, b.pool, "old", "webhook", []int{1})
	in := waitStatus(t, b.pool, "old", outbox.StatusDead)
	require.Contains(t, in.LastError, "maximum age")
}

// Rows sharing an ordering key are delivered one at a time in id order, even when
// deliveries fail at random, before the receiver acts (503) or after (the connection
// dropped before the answer); a failing head holds back only its own key. The order is
// checked over every request, not only over the effects: a loopback server in front of
// the receiver sees each attempt, and a key's next row may be sent only once the relay
// got the 200 for the one before it, never beside it.
func TestOrderingKeysUnderRandomFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{FailRate: 0.3, Seed: 7})
	const keys, perKey = 6, 25
	var (
		mu         sync.Mutex
		rnd        = mrand.New(mrand.NewPCG(7, 7))
		open       = map[int]bool{} // by key: a request in flight
		next       = map[int]int{}  // by key: the seq its next request must carry
		violations []string
		failures   int
		drops      int
	)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		req.Body = io.NopCloser(strings.NewReader(string(body)))
		var p struct{ K, Seq int }
		ordered := json.Unmarshal(body, &p) == nil // the blocked rows' payloads are arrays
		if ordered {
			mu.Lock()
			if open[p.K] {
				violations = append(violations, fmt.Sprintf("key %d: seq %d sent while another of its rows was in flight", p.K, p.Seq))
			}
			if p.Seq != next[p.K] {
				violations = append(violations, fmt.Sprintf("key %d: seq %d sent when seq %d was due", p.K, p.Seq, next[p.K]))
			}
			open[p.K] = true
			mu.Unlock()
		}
		// The answer is passed on only once the request is marked done, so the relay
		// cannot send the key's next row before then.
		rec := httptest.NewRecorder()
		b.receiver.ServeHTTP(rec, req)
		drop := false
		if ordered {
			mu.Lock()
			open[p.K] = false
			switch drop = rec.Code == http.StatusOK && rnd.Float64() < 0.1; {
			case drop:
				drops++ // the effect stands; the relay must send the row again
			case rec.Code == http.StatusOK:
				next[p.K] = p.Seq + 1
			default:
				failures++
			}
			mu.Unlock()
		}
		if drop {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(front.Close)
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: newHook(t, front.URL)}})

	var msgs []outbox.Message
	for i := range perKey {
		for k := range keys {
			msgs = append(msgs, outbox.Message{
				Key: fmt.Sprintf("ord-%d-%d", k, i), Connector: "webhook", OrderingKey: fmt.Sprintf("customer-%d", k),
				Payload: map[string]int{"k": k, "seq": i},
			})
		}
	}
	// A blocked head: its key waits, the others flow.
	b.receiver.Plan("blocked-head", receiver.Plan{FailFirst: 1000, RetryAfter: "3600"})
	msgs = append(msgs,
		outbox.Message{Key: "blocked-head", Connector: "webhook", OrderingKey: "stuck", Payload: []int{0}},
		outbox.Message{Key: "blocked-tail", Connector: "webhook", OrderingKey: "stuck", Payload: []int{1}})
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)

	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == keys*perKey },
		waitTimeout, 20*time.Millisecond)

	mu.Lock()
	require.Empty(t, violations[:min(len(violations), 5)], "the order of a key's requests (%d breaks)", len(violations))
	require.Positive(t, failures, "requests failed at random")
	require.Positive(t, drops, "answers were lost at random")
	for k := range keys {
		require.Equal(t, perKey, next[k], "key %d: every row answered 200", k)
	}
	mu.Unlock()
	last := map[int]int{}
	for k := range keys {
		last[k] = -1
	}
	for _, e := range b.receiver.EffectLog() {
		var p struct{ K, Seq int }
		require.NoError(t, json.Unmarshal(e.Body, &p))
		require.Equal(t, last[p.K]+1, p.Seq, "key %d delivered out of order", p.K)
		last[p.K] = p.Seq
	}
	require.Empty(t, b.receiver.DuplicateKeys())

	tail, err := outbox.Get(t.Context(), b.pool, "blocked-tail")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, tail.Status)
	require.Equal(t, 0, tail.Attempts, "the tail waits for its failing head")
	require.Zero(t, b.receiver.Requests("blocked-tail"))
}

// Three relays against one database and thousands of rows: one effect per key, no row
// lost or stuck. Each relay posts to its own path on a loopback server in front of the
// receiver, which holds the first requests until every relay has perRelay of them in
// flight at once: the relays really deliver side by side, each rows of its own, which
// the test checks rather than hopes for.
func TestThreeRelaysShareOneDatabase(t *testing.T) {
	t.Parallel()
	// The receiver ignores keys, so every request it takes is an effect: a row that two
	// relays sent would show as two, where a receiver that enforces keys would hide it.
	b := setup(t, receiver.Options{FailRate: 0.05, Seed: 3, IgnoreKeys: true})
	const rows, relays, perRelay = 3000, 3, 8
	var (
		mu       sync.Mutex
		inFlight = map[string]int{} // by path, until all meet
		met      = make(chan struct{})
	)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-met:
		default:
			mu.Lock()
			inFlight[req.URL.Path]++
			all := len(inFlight) == relays
			for _, n := range inFlight {
				all = all && n >= perRelay
			}
			if all {
				closeOnce(met)
			}
			mu.Unlock()
			select {
			case <-met:
			case <-req.Context().Done(): // the sender gave up: as if it never arrived
				mu.Lock()
				inFlight[req.URL.Path]--
				mu.Unlock()
				return
			}
		}
		b.receiver.ServeHTTP(w, req)
	}))
	t.Cleanup(front.Close)
	t.Cleanup(func() { closeOnce(met) })

	msgs := make([]outbox.Message, rows)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: outbox.Key("three", fmt.Sprint(i)), Connector: "webhook", Payload: map[string]int{"i": i}}
	}
	for i := 0; i < rows; i += 500 {
		_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs[i:i+500])
		require.NoError(t, err)
	}
	dropped := map[string]bool{} // the receiver acts, then drops the connection: sent twice
	for i := range 10 {
		b.receiver.Plan(msgs[i*100].Key, receiver.Plan{DropAfterEffect: 1})
		dropped[msgs[i*100].Key] = true
	}
	ids := map[string]bool{}
	for i := range relays {
		cfg := b.fastConfig()
		cfg.Registerer = prometheus.NewRegistry()
		cfg.BatchSize = 50
		cfg.Concurrency = 16
		hook, err := webhook.New(webhook.Config{URL: fmt.Sprintf("%s/relay-%d", front.URL, i), Guarantee: connectors.Enforced, Timeout: 20 * time.Second})
		require.NoError(t, err)
		r, _ := start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: hook}})
		ids[r.ID()] = true
	}
	require.Len(t, ids, relays)
	select {
	case <-met:
	case <-time.After(waitTimeout):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the relays never had %d deliveries each in flight at once: %v", perRelay, inFlight)
	}

	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == rows }, waitTimeout, 20*time.Millisecond)
	require.Equal(t, rows+len(dropped), b.receiver.TotalEffects())
	for _, m := range msgs {
		want := 1
		if dropped[m.Key] {
			want = 2
		}
		require.Equal(t, want, b.receiver.Effects(m.Key), "key %s", m.Key)
	}
	require.ElementsMatch(t, slices.Collect(maps.Keys(dropped)), b.receiver.DuplicateKeys(),
		"no row was sent by two relays; only the dropped ones were sent again")
	delivered := map[string]int{}
	rs, err := b.pool.Query(t.Context(), `SELECT relay_id, count(*) FROM outbox_attempts WHERE outcome = 'delivered' GROUP BY relay_id`)
	require.NoError(t, err)
	for rs.Next() {
		var (
			id string
			n  int
		)
		require.NoError(t, rs.Scan(&id, &n))
		require.True(t, ids[id], "an attempt logged by relay %q, not one of the three", id)
		delivered[id] = n
	}
	require.NoError(t, rs.Err())
	t.Logf("rows delivered by each relay: %v", delivered)
	require.Len(t, delivered, relays, "all three relays delivered rows")
	var total int
	for _, n := range delivered {
		total += n
	}
	require.Equal(t, rows, total, "one delivered attempt logged per row")
}

// One slow receiver never starves the others: its instance's concurrency limit keeps it
// from holding the relay's slots, and the rows claimed ahead for it are bounded too.
func TestSlowInstanceDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	// The slow attempts are stuck until the test lets them go, not for a 5s time limit
	// that a busy machine can reach while the fast rows go out (the slow rows would then
	// be retried, and the next ones sent). An hour's limit, with the lease 25s longer as
	// the default 30s is than 5s, claims as far ahead and gives rows as long to start.
	slowHook, slow, release := newSlowHook(t)
	b := setup(t, receiver.Options{})
	cfg := b.fastConfig()
	cfg.Concurrency = 8
	cfg.Lease = time.Hour + 25*time.Second
	start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook, Concurrency: 2, Rate: 50},
	})

	var msgs []outbox.Message
	for i := range 40 {
		msgs = append(msgs,
			outbox.Message{Key: fmt.Sprintf("slow-%d", i), Connector: "webhook:slow", Payload: []int{i}},
			outbox.Message{Key: fmt.Sprintf("fast-%d", i), Connector: "webhook", Payload: []int{i}})
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)

	require.Eventually(t, func() bool { return b.receiver.TotalEffects() == 40 }, waitTimeout, 10*time.Millisecond,
		"the fast instance delivers everything while the slow one is stuck")
	require.Eventually(t, func() bool { return slow.TotalEffects() == 2 }, waitTimeout, 10*time.Millisecond,
		"the slow receiver gets its limit of requests (%d)", slow.TotalEffects())
	require.Equal(t, 2, slow.TotalEffects(), "and never more while they are stuck")
	var delivering int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE connector = 'webhook:slow' AND status = 'delivering'`).Scan(&delivering))
	require.LessOrEqual(t, delivering, 2*(1+aheadRounds), "the slow instance holds its limit in flight and a bounded number claimed ahead")

	release()
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 80 }, waitTimeout, 10*time.Millisecond)
}

func TestClaimAhead(t *testing.T) {
	t.Parallel()
	tests := []struct {
		limit          int
		lease, timeout time.Duration
		ahead          int
		startBy        time.Duration
	}{
		{8, 30 * time.Second, 10 * time.Second, 8 * aheadRounds, 5 * time.Second}, // capped
		{8, 6 * time.Second, 5 * time.Second, 8 * aheadRounds, 500 * time.Millisecond},
		{8, 30 * time.Second, 29900 * time.Millisecond, 0, 50 * time.Millisecond}, // no room to wait ahead, and the attempt must still end inside the lease
		{8, 10 * time.Second, 20 * time.Second, 0, 2500 * time.Millisecond},       // a time limit beyond the lease
		{8, 30 * time.Second, 0, 0, maxStartBy},                                   // time limit unknown
		{8, 2 * time.Second, 0, 0, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		ahead, startBy := claimAhead(tt.limit, tt.lease, tt.timeout)
		require.Equal(t, tt.ahead, ahead, "%+v", tt)
		require.Equal(t, tt.startBy, startBy, "%+v", tt)
	}
}

func TestShareRoom(t *testing.T) {
	t.Parallel()
	a, b, c := &instance{name: "a"}, &instance{name: "b"}, &instance{name: "c"}
	tests := []struct {
		limits []int
		room   int
		want   []int
	}{
		{[]int{10, 20}, 100, []int{10, 20}}, // room enough for all
		{[]int{32, 8}, 32, []int{24, 8}},    // the small one needs less than half
		{[]int{30, 30, 30}, 31, []int{10, 10, 11}},
		{[]int{5, 40, 40}, 45, []int{5, 20, 20}},
		{[]int{4, 4, 4}, 2, []int{1, 1, 1}}, // less room than instances: one row each
	}
	for _, tt := range tests {
		plans := []claimPlan{}
		for i, l := range tt.limits {
			plans = append(plans, claimPlan{inst: []*instance{a, b, c}[i], limit: l})
		}
		share(plans, tt.room)
		var got []int
		for _, p := range plans {
			got = append(got, p.limit)
		}
		require.Equal(t, tt.want, got, "%v in %d", tt.limits, tt.room)
	}
}

// The rows claimed ahead shrink to what the workers can start within half of startBy
// at the instance's recent pace.
func TestRoomFollowsThePace(t *testing.T) {
	t.Parallel()
	inst := &instance{limit: 4, ahead: 12, startBy: 4 * time.Second}
	require.Equal(t, 16, inst.room(), "no pace known yet: the whole ahead")
	inst.took.Store(int64(time.Millisecond))
	require.Equal(t, 16, inst.room(), "fast attempts: the whole ahead")
	inst.took.Store(int64(time.Second))
	require.Equal(t, 4+8, inst.room(), "1s attempts: two rounds start within 2s")
	inst.took.Store(int64(10 * time.Second))
	require.Equal(t, 4, inst.room(), "slow attempts: nothing ahead")
	inst.claimed.Store(3)
	require.Equal(t, 1, inst.room())
	for range 100 {
		inst.observeTook(time.Millisecond)
	}
	require.InDelta(t, float64(time.Millisecond), float64(inst.took.Load()), float64(time.Millisecond), "the average follows recent attempts")
}

// A row claimed ahead that waited for a worker longer than the instance allows is
// handed back unsent, so its attempt never runs past its lease; it is delivered later,
// with no attempt counted or logged for the wait.
func TestRowClaimedAheadTooLongIsHandedBack(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	slow, err := receiver.Start(receiver.Options{OnEffect: func(e receiver.Effect) {
		if e.Key == "ahead-0" {
			<-release
		}
	}})
	require.NoError(t, err)
	t.Cleanup(slow.Close)
	t.Cleanup(func() { closeOnce(release) })
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	// ahead-0's attempt must last until the test lets it go, on the real clock too: a
	// time limit of 5s would end it on its own on a busy machine, and ahead-1 would then
	// start in time, before the relay's clock moves, and never be handed back. An hour's
	// limit with a lease a second longer leaves a row 500ms to wait, as 5s and 6s did.
	cfg.Lease = time.Hour + time.Second
	hook, err := webhook.New(webhook.Config{URL: slow.URL(), Guarantee: connectors.Enforced, Timeout: time.Hour})
	require.NoError(t, err)
	r, _ := start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: hook, Concurrency: 1}})
	require.Equal(t, 500*time.Millisecond, r.instances["webhook"].startBy)

	enqueue(t, b.pool, "ahead-0", "webhook", []int{0})
	enqueue(t, b.pool, "ahead-1", "webhook", []int{1})
	// The claimed-rows gauge counts a claim only once its round has read the committed
	// rows back, a moment after the database already shows them delivering: wait for it
	// too, not only for the database.
	require.Eventually(t, func() bool {
		return slow.TotalEffects() == 1 && countStatus(t, b.pool)["delivering"] == 2 &&
			testutil.ToFloat64(r.metrics.claimedRows) == 2
	}, waitTimeout, 10*time.Millisecond, "one row in flight, the other claimed ahead, and both rows held")
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.inFlight), "the gauges show the delivery in flight")

	clock.Advance(time.Second)
	closeOnce(release)
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 2 }, waitTimeout, 10*time.Millisecond)
	require.Equal(t, 1, slow.Effects("ahead-1"))
	// At least once: a round that read the clock before it moved may take the row again
	// with its old time, and then it is rightly handed back again.
	require.GreaterOrEqual(t, testutil.ToFloat64(r.metrics.handedBack), 1.0, "ahead-1 was handed back")
	var attempts, logged int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT o.attempts, (SELECT count(*) FROM outbox_attempts a WHERE a.outbox_id = o.id)
		FROM outbox o WHERE idempotency_key = 'ahead-1'`).Scan(&attempts, &logged))
	require.Equal(t, 1, attempts, "the wait was not counted as an attempt")
	require.Equal(t, 1, logged)
}

// A row whose worker waited for the relay's one delivery slot, held by another
// instance's slow attempt, past the time it could still start well inside its lease is
// handed back, not sent: had the wait outlasted the lease, the row could already be on
// its way again from another relay.
func TestRowThatWaitedTooLongForASlotIsHandedBack(t *testing.T) {
	t.Parallel()
	// The slow attempt ends only when the test lets it, not at a 5s time limit that a
	// busy machine can reach before the relay's clock moves (the slot would then free up
	// while the row is still in time, and it would be sent, not handed back).
	slowHook, slow, release := newSlowHook(t)
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Concurrency = 1
	cfg.Lease = 6 * time.Second // the webhook hook's 5s time limit leaves a row 500ms to start
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook},
	})
	require.Equal(t, 500*time.Millisecond, r.instances["webhook"].startBy)

	waitBehindSlowAttempt(t, b, slow, "waits")
	clock.Advance(time.Second)
	release()

	waitStatus(t, b.pool, "waits", outbox.StatusDelivered)
	require.Equal(t, 1, b.receiver.Effects("waits"))
	require.GreaterOrEqual(t, testutil.ToFloat64(r.metrics.handedBack), 1.0, "the row was handed back")
	var attempts int
	var waited time.Duration
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT o.attempts, max(a.started_at - o.first_attempt_at)
		FROM outbox o JOIN outbox_attempts a ON a.outbox_id = o.id WHERE o.idempotency_key = 'waits' GROUP BY o.id`).Scan(&attempts, &waited))
	require.Equal(t, 1, attempts, "the wait was not counted as an attempt")
	require.LessOrEqual(t, waited, 500*time.Millisecond, "the attempt started within its limit after its claim")
}

// A row already past its time to start when its worker takes it is handed back at
// once, without first waiting for a delivery slot: held behind another instance's slow
// attempt, it would stay claimed and unsent until its lease ran out, and then be logged
// as an ambiguous attempt that never happened.
func TestRowAlreadyTooLateIsHandedBackWithoutASlot(t *testing.T) {
	t.Parallel()
	first := make(chan struct{})
	t.Cleanup(func() { closeOnce(first) })
	slow, releaseSlow := blockingReceiver(t)
	b := setup(t, receiver.Options{OnEffect: func(e receiver.Effect) {
		if e.Key == "x" {
			<-first
		}
	}})
	clock, cfg := b.clockedConfig(t)
	cfg.Concurrency = 1
	cfg.Lease = 2 * time.Hour // a row may wait 5s to start
	// Both instances' attempts end only when the test lets them, not at a timeout: x's
	// too, which a 5s time limit (b.hook's) would end on its own on a busy machine, and
	// y would then start in time, before the relay's clock moves.
	slowHook, err := webhook.New(webhook.Config{URL: slow.URL(), Guarantee: connectors.Enforced, Timeout: time.Hour})
	require.NoError(t, err)
	hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Enforced, Timeout: time.Hour})
	require.NoError(t, err)
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: hook},
		"webhook:slow": {Connector: slowHook},
	})

	// x holds the one slot; the slow instance's worker waits for it with slow-1, and y
	// waits behind x for the webhook instance's one worker.
	enqueue(t, b.pool, "x", "webhook", []int{0})
	require.Eventually(t, func() bool { return b.receiver.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond)
	enqueue(t, b.pool, "y", "webhook", []int{1})
	require.Eventually(t, func() bool { return countStatus(t, b.pool)["delivering"] == 2 }, waitTimeout, 10*time.Millisecond)
	clock.Advance(3 * time.Second)
	enqueue(t, b.pool, "slow-1", "webhook:slow", []int{2})
	require.Eventually(t, func() bool { return countStatus(t, b.pool)["delivering"] == 3 }, waitTimeout, 10*time.Millisecond)
	clock.Advance(3 * time.Second) // y is past its 5s now, slow-1 is not

	// x ends and its slot goes to slow-1, the worker that waited for it; y, too late
	// already, must not wait for slow-1.
	closeOnce(first)
	require.Eventually(t, func() bool { return slow.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond,
		"slow-1 holds the slot")
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.handedBack) >= 1 }, waitTimeout, 10*time.Millisecond,
		"y was handed back while slow-1 held the slot")

	releaseSlow()
	waitStatus(t, b.pool, "x", outbox.StatusDelivered)
	in := waitStatus(t, b.pool, "y", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts)
	require.Equal(t, 1, b.receiver.Effects("y"))
}

// A receiver's answer holding NUL, which PostgreSQL's text and jsonb cannot store, is
// still recorded (with U+FFFD in its place): one unstorable answer must never stop the
// relay from recording outcomes and claiming rows.
func TestAnswersWithNULAreRecorded(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("busy\x00now"))
			return
		}
		_, _ = w.Write([]byte("ok\x00done"))
	}))
	t.Cleanup(srv.Close)
	b := setup(t, receiver.Options{})
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: newHook(t, srv.URL)}})
	enqueue(t, b.pool, "nul-answer", "webhook", []int{1})

	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 1 }, waitTimeout, 10*time.Millisecond)
	in, err := outbox.Get(t.Context(), b.pool, "nul-answer")
	require.NoError(t, err)
	require.Contains(t, string(in.Result), "ok\uFFFDdone")
	att := attemptsOf(t, b.pool, "nul-answer")
	require.Len(t, att, 2)
	require.Contains(t, att[0].Error, "busy\uFFFDnow")

	// The relay still claims and records after it.
	enqueue(t, b.pool, "after-nul", "webhook", []int{2})
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 2 }, waitTimeout, 10*time.Millisecond)
}

// oddAnswers is the webhook connector, except that for the keys in answers it returns
// that answer in place of the receiver's.
type oddAnswers struct {
	*webhook.Connector
	answers map[string]string
}

func (o oddAnswers) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	res, err := o.Connector.Deliver(ctx, d)
	if a, ok := o.answers[d.Key]; ok {
		return json.RawMessage(a), err
	}
	return res, err
}

// An answer PostgreSQL refuses (valid JSON to Go, but jsonb cannot hold the number) is
// dropped and the reason stored instead; the outcomes recorded with it in one batch,
// and the rows claimed after it, are not held up. An answer that is not UTF-8 is stored
// with U+FFFD.
func TestRefusedAnswerDoesNotStopTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	hook := oddAnswers{b.hook, map[string]string{
		"huge-number": `{"n": 1e1000000}`,
		"not-utf8":    "{\"s\": \"caf\xe9\"}",
	}}
	for i := range 20 {
		enqueue(t, b.pool, fmt.Sprint("before-", i), "webhook", []int{i})
	}
	enqueue(t, b.pool, "huge-number", "webhook", []int{1})
	enqueue(t, b.pool, "not-utf8", "webhook", []int{2})
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: hook}})
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 22 }, waitTimeout, 10*time.Millisecond)

	in, err := outbox.Get(t.Context(), b.pool, "huge-number")
	require.NoError(t, err)
	require.Empty(t, in.Result)
	require.Contains(t, in.LastError, "the receiver's answer could not be stored")
	require.Contains(t, in.LastError, "numeric")
	att := attemptsOf(t, b.pool, "huge-number")
	require.Len(t, att, 1, "one attempt, recorded once")
	require.Equal(t, "delivered", att[0].Outcome)

	in, err = outbox.Get(t.Context(), b.pool, "not-utf8")
	require.NoError(t, err)
	require.JSONEq(t, `{"s": "caf\uFFFD"}`, string(in.Result))

	// The relay goes on claiming and recording.
	enqueue(t, b.pool, "after", "webhook", []int{3})
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 23 }, waitTimeout, 10*time.Millisecond)
	require.Equal(t, 23, b.receiver.TotalEffects())
}

// A stopping relay's recorder, too, writes a batch the database refuses in parts, so
// the good outcomes are not lost with the odd ones.
func TestRecorderSalvagesRefusedBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	for i := range 9 {
		enqueue(t, b.pool, fmt.Sprint("salvage-", i), "webhook", []int{i})
	}
	r, err := New(b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	inst := r.instances["webhook"]
	got := claimRows(t, r, "webhook")
	require.Len(t, got, 9)
	var outs []outcome
	for i, row := range got {
		answer := json.RawMessage(`{"ok": true}`)
		if i == 2 || i == 7 {
			answer = json.RawMessage(`{"n": -1e1000000}`)
		}
		outs = append(outs, r.decide(inst, row, answer, nil, time.Now()))
	}
	r.writeOutcomes(t.Context(), outs)
	require.Equal(t, 9, countStatus(t, b.pool)[outbox.StatusDelivered])
	var dropped, kept, logged int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT
		count(*) FILTER (WHERE result IS NULL AND last_error LIKE '%could not be stored%'),
		count(*) FILTER (WHERE result = '{"ok": true}' AND last_error IS NULL),
		(SELECT count(*) FROM outbox_attempts)
		FROM outbox`).Scan(&dropped, &kept, &logged))
	require.Equal(t, 2, dropped)
	require.Equal(t, 7, kept)
	require.Equal(t, 9, logged, "each attempt logged once")
}

func TestDecodeHeaders(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string]string{"traceparent": "00-abc-01", "x-n": "5", "x-obj": `{"a":1}`},
		outbox.DecodeHeaders([]byte(`{"traceparent": "00-abc-01", "x-n": 5, "x-obj": {"a":1}}`)))
}

// A row whose headers plain SQL wrote with a value that is not a string is still
// claimed and delivered, and so are the rows after it.
func TestOddHeadersDoNotStopClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, headers)
		VALUES ('odd-headers', 'webhook', '{}', '{"x-count": 5}'), ('plain', 'webhook', '{}', '{}')`)
	require.NoError(t, err)
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	require.Eventually(t, func() bool { return b.receiver.TotalEffects() == 2 }, waitTimeout, 10*time.Millisecond)
	i := slices.IndexFunc(b.receiver.EffectLog(), func(e receiver.Effect) bool { return e.Key == "odd-headers" })
	require.GreaterOrEqual(t, i, 0)
	require.Equal(t, "5", b.receiver.EffectLog()[i].Headers.Get("X-Count"))
}

var closeMu sync.Mutex

// newSlowHook is a webhook connector on a receiver that holds each attempt until release
// is called; its own time limit is an hour, so one of its attempts holds a delivery slot
// for as long as a test wants.
func newSlowHook(t *testing.T) (hook *webhook.Connector, rcv *receiver.Receiver, release func()) {
	t.Helper()
	rcv, release = blockingReceiver(t)
	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced, Timeout: time.Hour})
	require.NoError(t, err)
	return hook, rcv, release
}

// blockingReceiver starts a receiver whose every effect waits until release is called
// (at the latest when the test ends).
func blockingReceiver(t *testing.T) (rcv *receiver.Receiver, release func()) {
	ch := make(chan struct{})
	release = func() { closeOnce(ch) }
	rcv, err := receiver.Start(receiver.Options{OnEffect: func(receiver.Effect) { <-ch }})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	t.Cleanup(release) // first: the blocked handlers return
	return rcv, release
}

// waitBehindSlowAttempt enqueues a row for webhook:slow, whose attempt to slow (a
// blockingReceiver) then holds a relay's one delivery slot, and then the row key for
// webhook, and returns once both are claimed: key's worker waits for the slot.
func waitBehindSlowAttempt(t *testing.T, b *testBundle, slow *receiver.Receiver, key string) {
	t.Helper()
	enqueue(t, b.pool, "slow", "webhook:slow", []int{0})
	require.Eventually(t, func() bool { return slow.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond,
		"the slow attempt holds the one slot")
	enqueue(t, b.pool, key, "webhook", []int{1})
	require.Eventually(t, func() bool { return countStatus(t, b.pool)["delivering"] == 2 }, waitTimeout, 10*time.Millisecond,
		"the second row is claimed, and its worker waits for the slot")
}

func closeOnce(ch chan struct{}) {
	closeMu.Lock()
	defer closeMu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// A row whose relay died mid-attempt is taken again once the lease expires, and the
// abandoned attempt is recorded as ambiguous.
func TestExpiredLeaseIsReclaimedAsAmbiguous(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	enqueue(t, b.pool, "orphan", "webhook", []int{1})
	enqueue(t, b.pool, "orphan-held", "webhook:hold", []int{1})
	enqueue(t, b.pool, "orphan-elsewhere", "webhook:elsewhere", []int{1})
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivering', attempts = 1, lease_owner = 'ghost',
		lease_expires_at = now() - interval '1 second', updated_at = now() - interval '31 seconds'`)
	require.NoError(t, err)

	forwarded, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Forwarded})
	require.NoError(t, err)
	r, _ := start(t, b.pool, b.fastConfig(), map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:hold": {Connector: forwarded, OnAmbiguous: AmbiguousHold},
	})

	in := waitStatus(t, b.pool, "orphan", outbox.StatusDelivered)
	require.Equal(t, 2, in.Attempts)
	require.Zero(t, r.instances["webhook:hold"].ahead, "a held instance claims only for free workers")
	require.Positive(t, r.instances["webhook"].ahead)
	att := attemptsOf(t, b.pool, "orphan")
	require.Len(t, att, 2)
	require.Equal(t, attemptRow{Attempt: 1, Outcome: "lease_expired", Ambiguous: true, Error: "lease expired before the outcome was recorded", RelayID: "ghost"}, att[0])
	require.Equal(t, "delivered", att[1].Outcome)

	held := waitStatus(t, b.pool, "orphan-held", outbox.StatusHeld)
	require.Contains(t, held.LastError, "held for an operator")
	require.Equal(t, 0, b.receiver.Effects("orphan-held"), "a forwarded row with the hold policy is not retried blindly")

	// A connector this relay does not have keeps its lease until a relay that has it,
	// and so knows its policy, puts it back.
	other, err := outbox.Get(t.Context(), b.pool, "orphan-elsewhere")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, other.Status)
}

func TestGracefulShutdown(t *testing.T) {
	t.Parallel()

	t.Run("in-flight deliveries finish, rows not started are released", func(t *testing.T) {
		t.Parallel()
		b := setup(t, receiver.Options{})
		// The in-flight attempt is held inside the connector, before its request goes
		// out, until the relay has been told to stop. Cancelling a context closes its
		// children's Done at once, so a relay that handed its workers a context ended by
		// the stop sends nothing (the webhook connector fails a cancelled attempt before
		// any request): this fails every time, not only when the cancellation happens to
		// beat the receiver's answer.
		held := &heldBeforeSend{Connector: b.hook, key: "in-flight", entered: make(chan struct{}), gate: make(chan struct{})}
		t.Cleanup(func() { closeOnce(held.gate) })
		cfg := b.fastConfig()
		cfg.Concurrency = 1 // one in flight; the rows behind it are claimed ahead, not started
		r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: held}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
		defer cancel()
		ran := make(chan error, 1)
		go func() { ran <- r.Run(ctx) }()
		enqueue(t, b.pool, "in-flight", "webhook", []int{1})
		waitFor(t, held.entered, "the in-flight row never reached the connector")
		for i := range 3 {
			enqueue(t, b.pool, fmt.Sprint("waiting-", i), "webhook", []int{i})
		}
		require.Eventually(t, func() bool { return countStatus(t, b.pool)["delivering"] == 4 }, waitTimeout, 10*time.Millisecond,
			"the waiting rows are claimed behind the one in flight")

		cancel() // the stop comes first, so no worker starts another row
		// The stopping relay hands back the rows it will not start while the attempt in
		// flight is still held: the stop has been acted on before the attempt goes on.
		require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusPending] == 3 }, waitTimeout, 10*time.Millisecond,
			"the rows not started are handed back at once")
		closeOnce(held.gate)
		select {
		case err := <-ran:
			require.NoError(t, err)
		case <-time.After(waitTimeout):
			t.Fatal("relay did not stop")
		}

		in, err := outbox.Get(t.Context(), b.pool, "in-flight")
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, in.Status, "the attempt in flight at the stop finished (%s)", in.LastError)
		require.Equal(t, 1, in.Attempts)
		require.Equal(t, 1, b.receiver.Effects("in-flight"))
		require.Equal(t, 1, b.receiver.Requests("in-flight"), "sent once: the receiver enforces keys, so its effects cannot show a second request")
		require.Equal(t, []attemptRow{{Attempt: 1, Outcome: "delivered", RelayID: r.ID()}}, attemptsOf(t, b.pool, "in-flight"))
		for i := range 3 {
			key := fmt.Sprint("waiting-", i)
			in, err := outbox.Get(t.Context(), b.pool, key)
			require.NoError(t, err)
			require.Equal(t, outbox.StatusPending, in.Status, key)
			require.Zero(t, in.Attempts, "%s: an attempt never started is not counted", key)
			require.Zero(t, b.receiver.Requests(key), key)
		}
		requireNoLeases(t, b.pool)
	})

	t.Run("deliveries past the timeout are cancelled and recorded", func(t *testing.T) {
		t.Parallel()
		arrived, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		b := setup(t, receiver.Options{OnEffect: func(receiver.Effect) { once.Do(func() { close(arrived) }); <-release }})
		t.Cleanup(func() { closeOnce(release) })
		cfg := b.fastConfig()
		cfg.ShutdownTimeout = 50 * time.Millisecond
		_, stop := start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
		enqueue(t, b.pool, "stuck", "webhook", []int{1})
		waitFor(t, arrived, "the stuck row never reached the receiver")
		stop()

		in, err := outbox.Get(t.Context(), b.pool, "stuck")
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, in.Status, "back for a retry (%s)", in.LastError)
		require.Contains(t, in.LastError, "shutdown timeout")
		// Named once: the webhook connector's error already says why its context ended.
		require.Equal(t, 1, strings.Count(in.LastError, "relay shutdown timeout reached"), in.LastError)
		att := attemptsOf(t, b.pool, "stuck")
		require.Len(t, att, 1)
		require.True(t, att[0].Ambiguous)
		requireNoLeases(t, b.pool)
	})
}

// heldBeforeSend is the webhook connector, except that the attempt for key waits, once
// it has started (entered is closed), until gate is closed, and only then sends.
type heldBeforeSend struct {
	*webhook.Connector
	key     string
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (h *heldBeforeSend) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	if d.Key == h.key {
		h.once.Do(func() { close(h.entered) })
		<-h.gate
	}
	return h.Connector.Deliver(ctx, d)
}

func requireNoLeases(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL OR status = 'delivering'`).Scan(&n))
	require.Zero(t, n, "no row is left leased")
}

func TestRetentionDeletesOldFinishedRows(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	for i := range 5 {
		enqueue(t, b.pool, fmt.Sprint("old-", i), "webhook", []int{i})
	}
	enqueue(t, b.pool, "recent", "webhook", []int{9})
	enqueue(t, b.pool, "old-dead", "webhook", []int{10})
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = CASE WHEN idempotency_key = 'old-dead' THEN 'dead' ELSE 'delivered' END,
		updated_at = now() - CASE WHEN idempotency_key = 'recent' THEN interval '1 hour' ELSE interval '8 days' END`)
	require.NoError(t, err)

	enqueue(t, b.pool, "other-relays-row", "webhook:other", []int{11})
	_, err = b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', updated_at = now() - interval '8 days'
		WHERE idempotency_key = 'other-relays-row'`)
	require.NoError(t, err)

	r, err := New(b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	r.deleteExpired(t.Context())

	var keys []string
	rows, err := b.pool.Query(t.Context(), `SELECT idempotency_key FROM outbox ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.Equal(t, []string{"recent", "old-dead", "other-relays-row"}, keys,
		"dead rows are kept for operators, and another relay's connectors follow that relay's retention")
}

// Retention never deletes a row that another transaction is changing: a replay moving
// a delivered row past retention back to pending must not lose it.
func TestRetentionSkipsRowsBeingReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	enqueue(t, b.pool, "replayed", "webhook", []int{1})
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', updated_at = now() - interval '8 days'`)
	require.NoError(t, err)
	r, err := New(b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)

	// What a replay with Redeliver does, in its own transaction, not yet committed.
	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(t.Context())) //nolint:errcheck // committed below
	_, err = tx.Exec(t.Context(), `UPDATE outbox SET status = 'pending', next_attempt_at = now(), updated_at = now()
		WHERE idempotency_key = 'replayed'`)
	require.NoError(t, err)

	done := make(chan struct{})
	go func() { defer close(done); r.deleteExpired(context.WithoutCancel(t.Context())) }()
	// Either retention passes the locked row by, or it waits for it; if it waits, the
	// replay commits, as it would, and retention must then still leave the row alone.
	require.Eventually(t, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		var waiting bool
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%DELETE FROM outbox%')`).Scan(&waiting))
		return waiting
	}, waitTimeout, 10*time.Millisecond)
	require.NoError(t, tx.Commit(t.Context()))
	<-done

	in, err := outbox.Get(t.Context(), b.pool, "replayed")
	require.NoError(t, err, "the replayed row survives retention")
	require.Equal(t, outbox.StatusPending, in.Status)
}

// An outcome that arrives after the row's lease ran out on its last allowed attempt, and
// a relay sent the row to dead as ambiguous, is still recorded: the receiver answered,
// and an operator must not see the row as undelivered and replay it.
func TestLateOutcomeAfterLastAttemptWentDead(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.MaxAttempts, cfg.Lease = 1, 10*time.Second
	sender, other := b.namedRelay(t, cfg, "sender"), b.namedRelay(t, cfg, "other")
	enqueue(t, b.pool, "late", "webhook", []int{1})
	got := claimRows(t, sender, "webhook")
	require.Len(t, got, 1)
	row := got[0]

	// The receiver acts, but the sender's outcome is written only after its lease ran out
	// and the other relay put the row away.
	clock.Advance(cfg.Lease + time.Second)
	other.reclaim(t.Context())
	in, err := outbox.Get(t.Context(), b.pool, "late")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDead, in.Status, "its only attempt was used")
	o := sender.decide(sender.instances["webhook"], row, json.RawMessage(`{"status":200}`), nil, clock.Now())
	o.started = row.claimedAt
	sender.writeOutcomes(t.Context(), []outcome{o})

	in, err = outbox.Get(t.Context(), b.pool, "late")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status, "the late answer is the truth")
	require.JSONEq(t, `{"status":200}`, string(in.Result))
	att := attemptsOf(t, b.pool, "late")
	require.Len(t, att, 2)
	require.Equal(t, "lease_expired", att[0].Outcome)
	require.Equal(t, "delivered", att[1].Outcome)
}

// A stale copy of a row, claimed again since its lease ran out, is never released in
// place of the new claim.
func TestReleaseLeavesARowClaimedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Lease = 10 * time.Second
	r := b.newRelay(t, cfg)
	enqueue(t, b.pool, "again", "webhook", []int{1})
	first := claimRows(t, r, "webhook")
	require.Len(t, first, 1)
	clock.Advance(cfg.Lease + time.Second)
	r.reclaim(t.Context())
	second := claimRows(t, r, "webhook")
	require.Len(t, second, 1)
	require.Equal(t, 2, second[0].attempt)

	r.release(t.Context(), first) // the stale copy
	in, err := outbox.Get(t.Context(), b.pool, "again")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "the second claim stands")
	require.Equal(t, 2, in.Attempts)
}

// A relay refuses a database whose schema is missing or older than it needs, at start,
// instead of failing every round while it looks ready.
func TestRunRefusesAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, sql string
		version   int
	}{
		{"NeverMigrated", `DROP TABLE outbox_schema_migrations`, 0},
		{"Older", `UPDATE outbox_schema_migrations SET version = 2`, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			_, err := b.pool.Exec(t.Context(), tt.sql)
			require.NoError(t, err)
			r, err := New(b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
			require.NoError(t, err)
			err = r.Run(t.Context())
			require.ErrorContains(t, err, fmt.Sprintf("the database's outbox schema is at version %d and this relay needs version %d: "+
				"run outboxd migrate", tt.version, outboxd.SchemaVersion))
			require.Error(t, r.Ready(t.Context()))
		})
	}
}

// A relay stopped while it still waits for its database at start has claimed nothing,
// so that stop is not a failure.
func TestRunStoppedBeforeTheDatabaseAnswers(t *testing.T) {
	t.Parallel()
	r := unreachableRelay(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, r.Run(ctx))
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := New(pool, &Config{Lease: -time.Second, BackoffBase: time.Hour, BackoffMax: time.Minute}, nil)
	require.ErrorContains(t, err, "Lease must not be negative")
	require.ErrorContains(t, err, "BackoffBase (1h0m0s) must not exceed BackoffMax (1m0s)")
	_, err = New(pool, nil, map[string]Instance{"webhook": {}})
	require.ErrorContains(t, err, `"webhook" has no Connector`)
	_, err = New(pool, nil, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/"), OnAmbiguous: "panic"}})
	require.ErrorContains(t, err, "OnAmbiguous")
}

// explain returns PostgreSQL's plan for query with args, without costs, as one text.
func explain(t *testing.T, pool *pgxpool.Pool, query string, args ...any) string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `EXPLAIN (COSTS OFF) `+query, args...)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(plan, "\n")
}

// TestClaimPlan keeps the EXPLAIN beside claimSQL honest: the claim uses the partial index.
func TestClaimPlan(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, ordering_key)
		SELECT 'k' || g, 'webhook', '{}', CASE WHEN g % 10 = 0 THEN 'o' || (g % 7) END FROM generate_series(1, 10000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `ANALYZE outbox`)
	require.NoError(t, err)
	joined := explain(t, pool, claimSQL, "webhook", time.Now(), 100, "r", time.Now(), time.Now().Add(-time.Hour), int64(1<<20))
	require.Contains(t, joined, "outbox_pending_due", joined)
	require.Contains(t, joined, "LockRows", joined)
	require.Regexp(t, `Index Cond: .*\(next_attempt_at >= `, joined, "the scan starts at $6")
	require.Contains(t, joined, "outbox_ordering_delivering", "a key's row in flight is found by its own index: %s", joined)
}

// The gauges count the rows waiting (pending, and held, awaiting approval or dead) by
// connector and status, and read only those: neither the delivered rows, however many,
// nor the index entries every claim leaves in outbox_delivering_lease.
func TestStats(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	_, err := pool.Exec(t.Context(), `
		INSERT INTO outbox (idempotency_key, connector, payload, status, created_at, lease_owner, lease_expires_at)
		VALUES ('p1', 'webhook', '{}', 'pending', $1::timestamptz - interval '90 seconds', NULL, NULL),
		       ('p2', 'webhook', '{}', 'pending', $1::timestamptz - interval '30 seconds', NULL, NULL),
		       ('f1', 'webhook', '{}', 'delivering', $1, 'r', $1::timestamptz + interval '1 minute'),
		       ('d1', 'webhook', '{}', 'dead', $1, NULL, NULL),
		       ('d2', 'webhook', '{}', 'dead', $1, NULL, NULL),
		       ('h1', 'webhook', '{}', 'held', $1, NULL, NULL),
		       ('a1', 'webhook', '{}', 'awaiting_approval', $1, NULL, NULL),
		       ('c1', 'webhook', '{}', 'canceled', $1, NULL, NULL),
		       ('crm', 'webhook:crm', '{}', 'pending', $1::timestamptz - interval '1 hour', NULL, NULL)`, t0)
	require.NoError(t, err)
	// Rows delivered through claims, as the relay does: each leaves an entry in
	// outbox_pending_due and one in outbox_delivering_lease until a vacuum.
	_, err = pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload)
		SELECT 'done-' || g, 'webhook', '{}' FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivering', lease_owner = 'r', lease_expires_at = now() + interval '1 hour', attempts = 1
		WHERE idempotency_key LIKE 'done-%'`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', lease_owner = NULL, lease_expires_at = NULL, delivered_at = now()
		WHERE idempotency_key LIKE 'done-%'`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `ANALYZE outbox`)
	require.NoError(t, err)

	r, err := New(pool, &Config{NowFunc: func() time.Time { return t0 }}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.refreshStats(t.Context())
	for status, want := range map[string]float64{"pending": 2, "dead": 2, "held": 1, "awaiting_approval": 1} {
		require.Equal(t, want, testutil.ToFloat64(r.metrics.rows.WithLabelValues("webhook", status)), status)
	}
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.rows.WithLabelValues("webhook:crm", "pending")))
	require.Equal(t, 5, testutil.CollectAndCount(r.metrics.rows), "four statuses of webhook and webhook:crm's pending; no delivering")
	require.Equal(t, 90.0, testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook")))
	require.Equal(t, 3600.0, testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook:crm")))
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")))

	joined := explain(t, pool, statsSQL, t0)
	require.NotContains(t, joined, "Seq Scan", joined)
	require.NotContains(t, joined, "outbox_delivering_lease", joined)
	for _, index := range []string{"outbox_pending_due", "outbox_needs_attention"} {
		require.Contains(t, joined, index, joined)
	}
}

// A claim that starts where the last one found rows does not walk the index entries of
// rows delivered since the last vacuum, which one that starts at the head does.
func TestClaimStartsPastDeliveredRows(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, next_attempt_at)
		SELECT 'old-' || g, 'webhook', '{}', now() - interval '1 hour' FROM generate_series(1, 5000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', attempts = 1`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload)
		SELECT 'new-' || g, 'webhook', '{}' FROM generate_series(1, 10) g`)
	require.NoError(t, err)

	// The index scan's buffers for a claim of one row starting at from, rolled back.
	indexBuffers := func(from pgtype.Timestamptz) int {
		lines := pgtest.Explain(t, pool, claimSQL,
			"webhook", time.Now().Add(time.Minute), 1, "r", time.Now().Add(time.Hour), from, int64(1<<20))
		return pgtest.ScanBuffers(t, lines, "Index Scan using outbox_pending_due")
	}
	head := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	indexBuffers(head) // the first scan marks the dead entries as such
	fromHead := indexBuffers(head)
	var newest time.Time
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT min(next_attempt_at) FROM outbox WHERE status = 'pending'`).Scan(&newest))
	fromCursor := indexBuffers(pgtype.Timestamptz{Time: newest.Add(-scanMargin), Valid: true})
	require.Greater(t, fromHead, 15, "from the head, the claim walks the delivered rows' entries")
	require.Less(t, fromCursor, 6, "from where the last claim found rows, it does not (from the head: %d)", fromHead)
}

func TestScanStart(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	inst := &instance{}
	require.True(t, inst.scanStart(t0, false, time.Second).IsZero(), "no claim found rows yet: from the head")

	due := t0.Add(-time.Minute)
	inst.scanFound([]claimed{{dueAt: due.Add(time.Second)}, {dueAt: due}, {dueAt: due.Add(2 * time.Second)}})
	require.Equal(t, due.Add(-scanMargin), inst.scanFrom, "scanMargin before the earliest row found")
	inst.scanFound(nil)
	require.Equal(t, due.Add(-scanMargin), inst.scanFrom, "a claim that found nothing leaves it")

	require.Equal(t, inst.scanFrom, inst.scanStart(t0.Add(500*time.Millisecond), false, time.Second))
	require.True(t, inst.scanStart(t0.Add(600*time.Millisecond), true, time.Second).IsZero(), "asked to: from the head")
	require.Equal(t, inst.scanFrom, inst.scanStart(t0.Add(1500*time.Millisecond), false, time.Second))
	require.True(t, inst.scanStart(t0.Add(1600*time.Millisecond), false, time.Second).IsZero(), "a poll interval after the last: from the head")

	inst.scanFound([]claimed{{dueAt: due}, {}})
	require.True(t, inst.scanFrom.IsZero(), "a row due since -infinity: from the head")
}

// Rows that plain SQL wrote with timestamps at ±infinity are claimed and delivered like
// any other, and the relay goes on claiming after them.
func TestInfiniteTimestampsDoNotStopClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, next_attempt_at, created_at)
		VALUES ('due-forever', 'webhook', '{}', '-infinity', now()),
		       ('born-never', 'webhook', '{}', now(), '-infinity'),
		       ('born-later', 'webhook', '{}', now(), 'infinity')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, first_attempt_at, attempts)
		VALUES ('tried-never', 'webhook', '{}', '-infinity', 1)`)
	require.NoError(t, err)
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 4 }, waitTimeout, 10*time.Millisecond)
	enqueue(t, b.pool, "after", "webhook", []int{1})
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 5 }, waitTimeout, 10*time.Millisecond)
}

// A row that turns due behind where claims start (here written with an old
// next_attempt_at, as a long transaction or an operator might) is still delivered, and
// so are ordered rows there, in order.
func TestRowBehindWhereClaimsStartIsDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	enqueue(t, b.pool, "first", "webhook", []int{1})
	waitStatus(t, b.pool, "first", outbox.StatusDelivered)

	_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, ordering_key, next_attempt_at)
		VALUES ('behind', 'webhook', '{}', NULL, now() - interval '1 hour'),
		       ('behind-1', 'webhook', '{}', 'k', now() - interval '1 hour'),
		       ('behind-2', 'webhook', '{}', 'k', now() - interval '1 hour'),
		       ('behind-3', 'webhook', '{}', 'k', now() - interval '1 hour')`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 5 }, waitTimeout, 10*time.Millisecond)
	var order []string
	for _, e := range b.receiver.EffectLog() {
		if strings.HasPrefix(e.Key, "behind-") {
			order = append(order, e.Key)
		}
	}
	require.Equal(t, []string{"behind-1", "behind-2", "behind-3"}, order)
}

// A rate-limited instance is claimed no faster than its rate allows, so a receiver's limit
// is respected before it has to answer 429.
func TestRateLimitBoundsClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	for i := range 20 {
		enqueue(t, b.pool, fmt.Sprint("limited-", i), "webhook", []int{i})
	}
	// The limiter runs on the relay's clock, so the test decides when a token comes.
	clock, cfg := b.clockedConfig(t)
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook, Rate: 5}})
	require.NoError(t, err)

	ctx := t.Context()
	claimed, _, more, retryIn, err := r.claimRound(ctx, nil, false)
	require.NoError(t, err)
	require.Equal(t, 1, claimed, "a tenth of a second's worth at once (at least one), not a second's: after a "+
		"quiet spell a second's worth and then the rate would be twice the rate within one second")
	require.True(t, more)
	require.Zero(t, retryIn)
	inst := r.instances["webhook"]
	require.Len(t, inst.jobs, 1, "the claimed row waits for the instance's workers")
	for range claimed {
		r.deliver(ctx, inst, <-inst.jobs)
	}
	require.Equal(t, 1, b.receiver.TotalEffects())

	// The bucket is empty now: the next round claims nothing and says when to look
	// again, when the next token comes at 5 a second.
	claimed, _, _, retryIn, err = r.claimRound(ctx, nil, false)
	require.NoError(t, err)
	require.Zero(t, claimed)
	require.Equal(t, 200*time.Millisecond, retryIn)
	var delivering int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status = 'delivering'`).Scan(&delivering))
	require.Equal(t, 1, delivering, "the outcome was never recorded here, and nothing more was claimed")

	// Once it has come, one more row.
	clock.Advance(retryIn)
	claimed, _, _, _, err = r.claimRound(ctx, nil, false)
	require.NoError(t, err)
	require.Equal(t, 1, claimed)
}

// The LISTEN connection comes back after PostgreSQL drops it, and NOTIFY wakes the relay
// again.
func TestListenReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	r := b.startNotifyOnly(t)

	killListen(t, b.pool)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)

	enqueue(t, b.pool, "after-reconnect", "webhook", []int{1})
	waitStatus(t, b.pool, "after-reconnect", outbox.StatusDelivered)
}

// Behind a transaction-mode pooler NOTIFY never reaches the relay; it must say so loudly.
func TestNotifySelfTestWarnsWhenNotificationsDoNotArrive(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	var logs logBuffer
	cfg := b.fastConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r, err := New(b.pool, cfg, nil)
	require.NoError(t, err)
	r.probeTimeout = 50 * time.Millisecond

	// No LISTEN connection is up, exactly as behind a pooler that drops LISTEN sessions.
	// The self-test then waits for a late notification until its connection ends.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.checkNotify(ctx, make(chan struct{}))
	}()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "NOTIFY DOES NOT REACH THIS RELAY") }, waitTimeout, 10*time.Millisecond)
	cancel()
	<-done
	require.Contains(t, logs.String(), "transaction mode")
	require.Zero(t, testutil.ToFloat64(r.metrics.notifyWorking))
}

// connectionGate returns a function that lets new connections into the test's database
// or not (ALTER DATABASE ... ALLOW_CONNECTIONS, from another database); they are let in
// again when the test ends.
func (b *testBundle) connectionGate(t *testing.T) func(allow bool) {
	t.Helper()
	var db string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT current_database()`).Scan(&db))
	adminCfg := b.pool.Config().ConnConfig.Copy()
	adminCfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(t.Context(), adminCfg)
	require.NoError(t, err)
	allow := func(ok bool) {
		_, err := admin.Exec(context.WithoutCancel(t.Context()), `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS `+map[bool]string{true: "true", false: "false"}[ok])
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		allow(true)
		_ = admin.Close(context.Background())
	})
	return allow
}

// killListen terminates the LISTEN connection of the relay on pool's database.
func killListen(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var killed bool
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND query = 'LISTEN outbox'`).Scan(&killed))
	require.True(t, killed)
}

// logBuffer collects a relay's logs for a test to read while the relay writes them.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// windowed is a webhook connector whose receiver remembers keys only for a while.
type windowed struct {
	*webhook.Connector
	window time.Duration
}

func (w windowed) KeyWindow() time.Duration { return w.window }

// An enforced receiver forgets keys after its window: the relay never sends a retry past
// it, because that retry could act twice. It holds the row for an operator instead.
func TestNoRetryAfterTheReceiverForgetsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.BackoffBase = 10 * time.Minute
	cfg.BackoffMax = 10 * time.Minute
	hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Enforced, NowFunc: clock.Now})
	require.NoError(t, err)
	r, _ := start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: windowed{hook, time.Hour}, MaxAge: 48 * time.Hour}})
	require.Equal(t, 48*time.Hour, r.instances["webhook"].maxAge, "an explicit MaxAge stands")

	b.receiver.Plan("late", receiver.Plan{FailFirst: 1})
	enqueue(t, b.pool, "late", "webhook", []int{1})
	require.Eventually(t, func() bool {
		in, err := outbox.Get(t.Context(), b.pool, "late")
		return err == nil && in.Attempts == 1 && in.Status == outbox.StatusPending
	}, waitTimeout, 10*time.Millisecond)

	// The relay was away for two hours: the retry is due, but the key is forgotten.
	clock.Advance(2 * time.Hour)
	in := waitStatus(t, b.pool, "late", outbox.StatusHeld)
	require.Contains(t, in.LastError, "remembers idempotency keys for 1h0m0s")
	require.Contains(t, in.LastError, "not sent")
	require.Equal(t, 1, b.receiver.Requests("late"), "nothing was sent after the window")
	// The attempt not sent took the connector no time: it counts as held, and
	// outboxd_delivery_duration_seconds ("time a connector took for one attempt") has no
	// 0s sample for it.
	n, _ := histogramOf(t, b.registry, "outboxd_delivery_duration_seconds", "webhook")
	require.EqualValues(t, 1, n, "one attempt reached the connector")
	require.Equal(t, 1.0, testutil.ToFloat64(r.instances["webhook"].outcomes[statusHeld]))

	// Without an explicit MaxAge, an instance gives up inside its key window, early enough
	// that its last attempt ends inside it (the webhook's time limit is 10s).
	r2, err := New(b.pool, &Config{Registerer: prometheus.NewRegistry()}, map[string]Instance{"webhook": {Connector: windowed{hook, time.Hour}}})
	require.NoError(t, err)
	require.Equal(t, time.Hour-10*time.Second, r2.instances["webhook"].maxAge)
}

// An attempt started just inside the key window could still reach the receiver after
// it, as late as the connector's time limit allows: such an attempt is not sent either.
func TestKeyWindowCountsTheAttemptsTimeLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	hook, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Enforced, Timeout: 10 * time.Second})
	require.NoError(t, err)
	r, err := New(b.pool, &Config{Registerer: prometheus.NewRegistry()}, map[string]Instance{"webhook": {Connector: windowed{hook, time.Hour}}})
	require.NoError(t, err)
	inst := r.instances["webhook"]
	first := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	row := claimed{firstAt: first}
	require.False(t, inst.forgotten(row, first.Add(time.Hour-10*time.Second)), "ends by the window's end at the latest")
	require.True(t, inst.forgotten(row, first.Add(time.Hour-9*time.Second)), "could arrive a second after the window")

	// A connector without a time limit: its attempt may last as long as the lease.
	r2, err := New(b.pool, &Config{Registerer: prometheus.NewRegistry(), Lease: time.Minute},
		map[string]Instance{"webhook": {Connector: windowed{hook, time.Hour}}})
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, r2.instances["webhook"].attemptMax)
	r3, err := New(b.pool, &Config{Registerer: prometheus.NewRegistry(), Lease: time.Minute},
		map[string]Instance{"webhook": {Connector: noTimeout{windowed{hook, time.Hour}}}})
	require.NoError(t, err)
	require.Equal(t, time.Minute, r3.instances["webhook"].attemptMax)
}

// noTimeout hides its connector's time limit.
type noTimeout struct{ windowed }

func (noTimeout) Timeout() time.Duration { return 0 }

// Rows claimed but never started (the relay stopped in between) go back as they were.
func TestReleaseUnstartedRows(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	for i := range 3 {
		enqueue(t, b.pool, fmt.Sprint("unstarted-", i), "webhook", []int{i})
	}
	r, err := New(b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	got := claimRows(t, r, "webhook")
	require.Len(t, got, 3)
	r.release(t.Context(), got)

	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE status = 'pending' AND attempts = 0
		AND lease_owner IS NULL AND first_attempt_at IS NULL`).Scan(&n))
	require.Equal(t, 3, n)
	require.Zero(t, b.receiver.TotalEffects())
}

// randomText returns n characters that do not compress, so PostgreSQL stores them at
// full size.
func randomText(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n*3/4+3)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return base64.StdEncoding.EncodeToString(b)[:n]
}

// claimRows claims up to 10 due rows of r's instance name in one transaction, with no
// outcomes to write, and returns them.
func claimRows(t *testing.T, r *Relay, name string) []claimed {
	t.Helper()
	got, err := r.claimAndRecord(t.Context(), []claimPlan{{inst: r.instances[name], limit: 10, bytes: 1 << 20}}, nil)
	require.NoError(t, err)
	return got[0]
}

// claimOnce runs one claim round of r, with no outcomes to write, and returns how many
// rows it claimed.
func claimOnce(t *testing.T, r *Relay) int {
	t.Helper()
	n, _, _, _, err := r.claimRound(t.Context(), nil, false)
	require.NoError(t, err)
	return n
}

// A claim's round carries the outcomes waiting only when there are many of them
// (recordWithClaim); a few wait until they must be written (record: their linger ran
// out, or one is of a row with an ordering key), so that claims at light load stay
// quick.
func TestFewOutcomesDoNotRideWithClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r := b.newRelay(t, cfg)
	inst := r.instances["webhook"]
	insert := func(prefix string, n int) {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Key: fmt.Sprintf("%s-%d", prefix, i), Connector: "webhook", Payload: []int{i}}
		}
		_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
		require.NoError(t, err)
		clock.Advance(time.Minute) // they are due
	}
	// outcomes takes n claimed rows from the workers' queue and answers them delivered.
	outcomes := func(n int) []outcome {
		outs := make([]outcome, n)
		for i := range outs {
			row := <-inst.jobs
			r.done(inst, row)
			outs[i] = r.decide(inst, row, json.RawMessage(`{"status":200}`), nil, r.now())
			outs[i].started = row.claimedAt
		}
		return outs
	}
	round := func(outs []outcome, record bool) (int, bool) {
		t.Helper()
		claimed, wrote, _, _, err := r.claimRound(t.Context(), outs, record)
		require.NoError(t, err)
		return claimed, wrote
	}

	insert("few", 3)
	require.Equal(t, 3, claimOnce(t, r))
	few := outcomes(3)
	insert("next", 2)
	claimed, wrote := round(few, false)
	require.Equal(t, 2, claimed)
	require.False(t, wrote, "three outcomes do not ride with a claim")
	require.Equal(t, map[string]int{"delivering": 5}, countStatus(t, b.pool))
	claimed, wrote = round(few, true)
	require.Zero(t, claimed)
	require.True(t, wrote, "written once they must be")
	require.Equal(t, map[string]int{"delivering": 2, "delivered": 3}, countStatus(t, b.pool))

	insert("many", recordWithClaim)
	require.Equal(t, recordWithClaim, claimOnce(t, r))
	many := outcomes(2 + recordWithClaim)
	insert("last", 1)
	claimed, wrote = round(many, false)
	require.Equal(t, 1, claimed)
	require.True(t, wrote, "many outcomes ride with the claim")
	require.Equal(t, map[string]int{"delivering": 1, "delivered": 5 + recordWithClaim}, countStatus(t, b.pool))
}

// The rows a relay holds claimed stay within MaxClaimedBytes of payload: a claim stops
// at what is left, none is made while less than a quarter is left, and a payload larger
// than the bound is still claimed, alone.
func TestClaimedBytesAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	cfg.MaxClaimedBytes = 100_000
	r := b.newRelay(t, cfg)
	inst := r.instances["webhook"]
	require.Positive(t, inst.ahead, "the instance claims ahead, so only the bytes bound the claims")

	var msgs []outbox.Message
	for i := range 10 {
		msgs = append(msgs, outbox.Message{Key: fmt.Sprintf("big-%d", i), Connector: "webhook",
			Payload: map[string]string{"data": randomText(t, 30_000)}})
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	round := func() int { return claimOnce(t, r) }
	finish := func(n int) {
		for range n {
			r.done(inst, <-inst.jobs)
		}
	}

	require.Equal(t, 4, round(), "30 kB rows while those before add up to less than 100 kB")
	require.InDelta(t, 4*30_000, r.claimedBytes.Load(), 4*100)
	require.Equal(t, float64(r.claimedBytes.Load()), testutil.ToFloat64(r.metrics.claimedBytes), "the gauge shows them")
	require.Zero(t, round(), "nothing left")
	finish(2)
	require.Equal(t, 2, round(), "40 kB left: the second row starts below it")
	finish(1)
	require.Zero(t, round(), "10 kB left, less than a quarter: no claim")
	finish(3)
	require.Equal(t, 4, round(), "all left again")
	require.Equal(t, 10, countStatus(t, b.pool)["delivering"])
	finish(4)
	require.Zero(t, r.claimedBytes.Load())
	require.Zero(t, round(), "every row is claimed")

	enqueue(t, b.pool, "huge", "webhook", map[string]string{"data": randomText(t, 300_000)})
	enqueue(t, b.pool, "after-huge", "webhook", []int{1})
	require.Equal(t, 1, round(), "a payload larger than the bound, alone")
	require.Zero(t, round())
	finish(1)
	require.Equal(t, 1, round(), "then the next")
}

// One instance's large payloads do not stop another instance's claims: while the
// bytes are spent, an instance that holds no rows still claims one.
func TestLargePayloadsDoNotStopOtherInstances(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	cfg.MaxClaimedBytes = 100_000
	r, err := New(b.pool, cfg, map[string]Instance{"webhook:big": {Connector: b.hook}, "webhook": {Connector: b.hook}})
	require.NoError(t, err)
	round := func() int { return claimOnce(t, r) }
	enqueue(t, b.pool, "big", "webhook:big", map[string]string{"data": randomText(t, 300_000)})
	require.Equal(t, 1, round())
	enqueue(t, b.pool, "small-1", "webhook", []int{1})
	enqueue(t, b.pool, "small-2", "webhook", []int{2})
	require.Equal(t, 1, round(), "the other instance holds nothing: it claims a row")
	require.Zero(t, round(), "and then waits for it, as the bytes are spent")
	small := r.instances["webhook"]
	r.done(small, <-small.jobs)
	require.Equal(t, 1, round())
	require.Equal(t, "big", (<-r.instances["webhook:big"].jobs).key)
}

// With a bound that holds few rows, every row is still delivered, once: a worker that
// finishes makes room for the next claim.
func TestLargePayloadsAreDeliveredWithinTheBound(t *testing.T) {
	t.Parallel()
	// The receiver ignores keys, so every request it takes is an effect: a row sent
	// twice shows as two, where a receiver that enforces keys would hide it.
	b := setup(t, receiver.Options{IgnoreKeys: true})
	cfg := b.fastConfig()
	cfg.MaxClaimedBytes = 100_000
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	var msgs []outbox.Message
	for i := range 30 {
		msgs = append(msgs, outbox.Message{Key: fmt.Sprintf("large-%d", i), Connector: "webhook",
			Payload: map[string]string{"data": randomText(t, 30_000)}})
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return countStatus(t, b.pool)[outbox.StatusDelivered] == 30 }, waitTimeout, 10*time.Millisecond)
	require.Equal(t, 30, b.receiver.TotalEffects())
	require.Empty(t, b.receiver.DuplicateKeys())
}

// The maximum age bounds how long a row is retried, from its first attempt: a row
// scheduled (not_before) or approved later than that after its creation is not sent to
// dead by its first failure, as it was when the age counted from created_at. The
// reclaim of an expired lease counts the same way.
func TestMaxAgeCountsFromTheFirstAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.MaxAge = time.Hour
	cfg.BackoffBase, cfg.BackoffMax = time.Minute, time.Hour
	b.receiver.Plan("scheduled", receiver.Plan{FailFirst: 1})
	_, err := outbox.Enqueue(t.Context(), b.pool, outbox.Message{
		Key: "scheduled", Connector: "webhook", Payload: json.RawMessage(`[1]`), NotBefore: clock.Now().Add(3 * time.Hour)})
	require.NoError(t, err)
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})

	clock.Advance(3 * time.Hour)
	require.Eventually(t, func() bool {
		in, err := outbox.Get(t.Context(), b.pool, "scheduled")
		return err == nil && in.Attempts == 1 && in.Status != outbox.StatusDelivering
	}, waitTimeout, 10*time.Millisecond)
	in, err := outbox.Get(t.Context(), b.pool, "scheduled")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status, "retried within an hour of its first attempt: %s", in.LastError)

	clock.Advance(2 * time.Minute)
	waitStatus(t, b.pool, "scheduled", outbox.StatusDelivered)
}

// reclaimSQL's maximum age counts from the first attempt too.
func TestReclaimMaxAgeCountsFromTheFirstAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Lease = 10 * time.Second
	cfg.MaxAge = time.Hour
	instances := map[string]Instance{"webhook": {Connector: b.hook}}
	sender, other := newRelayAs(t, b, cfg, instances, "sender"), newRelayAs(t, b, cfg, instances, "other")
	_, err := outbox.Enqueue(t.Context(), b.pool, outbox.Message{
		Key: "scheduled", Connector: "webhook", Payload: json.RawMessage(`[1]`), NotBefore: clock.Now().Add(3 * time.Hour)})
	require.NoError(t, err)
	clock.Advance(3 * time.Hour)
	require.Len(t, claimRows(t, sender, "webhook"), 1)

	clock.Advance(time.Minute) // the sender vanishes; its lease runs out
	other.reclaim(t.Context())
	in, err := outbox.Get(t.Context(), b.pool, "scheduled")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status, "a minute after its first attempt, within its hour: %s", in.LastError)
}

// A relay on a pool in the simple protocol (as behind a transaction pooler) or the exec
// mode stores the receiver's answer: the answers went as [][]byte, which those modes send
// as bytea text, which PostgreSQL refused as jsonb; the write was salvaged without them.
func TestReceiversAnswerIsStoredInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			start(t, pgtest.InMode(t, b.pool, mode), b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
			enqueue(t, b.pool, "answered", "webhook", []int{1})
			in := waitStatus(t, b.pool, "answered", outbox.StatusDelivered)
			require.Contains(t, string(in.Result), `"status"`, "the receiver's answer is stored: %s", in.Result)
		})
	}
}

// unreachableRelay is a relay whose database address has nothing listening.
func unreachableRelay(t *testing.T) *Relay {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), "postgres://outboxd@"+pgtest.UnreachableAddr(t)+"/outboxd?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	return r
}
