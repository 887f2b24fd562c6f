package relay

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A refresh of the row gauges that fails while the query runs (a lock or statement
// timeout, a cancel, a lost connection: pgx reports those from rows.Err, not from
// Query) keeps the last values, as a refresh that fails to start does. It used to reset
// every series first and report no pending rows at all. The age of the oldest pending
// row goes on growing from the last refresh that worked: kept as it was, it stood still
// while the refreshes failed (the database away, a refresh timing out on a grown
// backlog), when rows wait longest, and an alert on it never fired.
func TestFailedStatsRefreshKeepsTheLastValues(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "p1", "webhook", []int{1})
	enqueue(t, pool, "p2", "webhook", []int{2})
	enqueue(t, pool, "crm", "webhook:crm", []int{3})

	// The relay's own pool gives up on a lock after 100ms.
	cfg := pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "100ms"
	relayPool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)
	clock := &testClock{now: dbNow(t, pool)}
	cfg2 := &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger(), NowFunc: clock.Now}
	r, err := New(relayPool, cfg2, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.Equal(t, 2.0, testutil.ToFloat64(r.metrics.rows.WithLabelValues("webhook", "pending")))
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")))
	oldest := testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook"))
	require.Positive(t, oldest)
	due := testutil.ToFloat64(r.metrics.oldestDueWait.WithLabelValues("webhook"))
	require.Positive(t, due)

	// Another transaction holds the table: the next refresh fails.
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = tx.Exec(t.Context(), `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	before := testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("stats"))
	clock.Advance(5 * time.Minute)
	r.refreshStats(t.Context())

	require.Equal(t, 2.0, testutil.ToFloat64(r.metrics.rows.WithLabelValues("webhook", "pending")), "the last value stays")
	require.InDelta(t, oldest+300, testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook")), 0.001,
		"the oldest row seen has waited five minutes more")
	require.InDelta(t, due+300, testutil.ToFloat64(r.metrics.oldestDueWait.WithLabelValues("webhook")), 0.001,
		"and the oldest due row too")
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")))
	require.Equal(t, before+1, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("stats")), "the failure is counted")
}

// outboxd_notify_working says whether NOTIFY wake-ups reach the relay: 0 while its
// LISTEN connection is down (it relies on polling), and it tells again once the
// connection is back, with a new self-test. It used to stay at whatever the first
// connection's self-test found.
func TestNotifyWorkingFollowsTheListenConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	r := b.startNotifyOnly(t)

	allow := b.connectionGate(t)
	// No new connection, the LISTEN one killed: the relay cannot listen again.
	allow(false)
	killListen(t, b.pool)
	require.Eventually(t, func() bool { return !r.listening.Load() }, waitTimeout, 10*time.Millisecond, "LISTEN is down")
	require.ErrorContains(t, r.Ready(t.Context()), "LISTEN")
	require.Zero(t, testutil.ToFloat64(r.metrics.notifyWorking), "relying on polling while LISTEN is down")

	allow(true)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond,
		"the self-test runs again on the new connection")
}

// A relay asked to stop claims nothing more: it is not ready, even while the attempts in
// flight finish (up to the shutdown timeout). It used to answer ready until Run returned.
func TestStoppingRelayIsNotReady(t *testing.T) {
	t.Parallel()
	slow, release := blockingReceiver(t)
	b := setup(t, receiver.Options{})
	r, err := New(b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: newHook(t, slow.URL())}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	enqueue(t, b.pool, "in-flight", "webhook", []int{1})
	require.Eventually(t, func() bool { return slow.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond)

	cancel()
	err = r.Ready(t.Context())
	require.ErrorContains(t, err, "stopping", "the attempt in flight is still finishing")

	release()
	require.NoError(t, <-ran)
	require.Error(t, r.Ready(t.Context()))
	waitStatus(t, b.pool, "in-flight", outbox.StatusDelivered)
}

// histogramOf returns the sample count and sum of the histogram name{connector}.
func histogramOf(t *testing.T, reg *prometheus.Registry, name, connector string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "connector" && l.GetValue() == connector {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}

// A row scheduled for later (NotBefore) is measured by outboxd_commit_to_delivery_seconds
// from when it was due, not from its creation: it used to add the whole schedule (hours,
// days) to the latency histogram, all in its +Inf bucket.
func TestCommitToDeliveryOfAScheduledRow(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	notBefore := clock.Now().Add(2 * time.Hour).Truncate(time.Microsecond)
	_, err := outbox.Enqueue(t.Context(), b.pool, outbox.Message{Key: "later", Connector: "webhook", Payload: []int{1}, NotBefore: notBefore})
	require.NoError(t, err)
	enqueue(t, b.pool, "now", "webhook", []int{2})
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	waitStatus(t, b.pool, "now", outbox.StatusDelivered)
	n, sumNow := histogramOf(t, b.registry, "outboxd_commit_to_delivery_seconds", "webhook")
	require.EqualValues(t, 1, n)

	clock.Advance(2*time.Hour + 30*time.Second)
	waitStatus(t, b.pool, "later", outbox.StatusDelivered)
	n, sum := histogramOf(t, b.registry, "outboxd_commit_to_delivery_seconds", "webhook")
	require.EqualValues(t, 2, n)
	require.InDelta(t, clock.Now().Sub(notBefore).Seconds(), sum-sumNow, 0.001, "measured from its NotBefore")
}

// A row of a connector this relay does not have, left delivering by a relay that had it
// and died, waits for a relay with the connector to put it back, as a pending one waits
// to be claimed: outboxd_unknown_connector_rows reports it once its lease has expired.
// It used to be in no series at all (outboxd_rows leaves delivering rows out), so the
// metrics showed nothing left for that connector.
func TestUnknownConnectorRowsLeftLeasedAreReported(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "orphan", "webhook:crm", []int{1})
	enqueue(t, pool, "live", "webhook:crm", []int{2})
	_, err := pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivering', attempts = 1, lease_owner = 'ghost',
		lease_expires_at = CASE idempotency_key WHEN 'orphan' THEN now() - interval '1 second' ELSE now() + interval '1 hour' END`)
	require.NoError(t, err)
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")),
		"the row whose lease expired; the live lease is a relay at work")

	_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL`)
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.Equal(t, 2.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")))
	_, err = pool.Exec(t.Context(), `DELETE FROM outbox`)
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.Zero(t, testutil.CollectAndCount(r.metrics.unknownConnector), "no series once the rows are gone")
}

// The in-flight gauge may be read as soon as New has registered it: a registry that a
// running /metrics handler serves already (prometheus.DefaultRegisterer in a program that
// embeds the relay, say) is gathered at any moment. The gauge counted the instances'
// own slots through the instances map, which New goes on filling after registering it,
// so a scrape then raced with New: a fatal "concurrent map iteration and map write" when
// the two met.
func TestInFlightGaugeMayBeReadWhileNewRuns(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	instances := map[string]Instance{}
	for i := range 20 {
		instances[fmt.Sprintf("webhook:w%d", i)] = Instance{Connector: newHook(t, "http://127.0.0.1:1/")}
	}
	reg := prometheus.NewRegistry()
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			mfs, err := reg.Gather()
			if err != nil {
				return
			}
			for _, mf := range mfs {
				if mf.GetName() == "outboxd_deliveries_in_flight" {
					return // read once registered
				}
			}
		}
	}()
	_, err := New(pool, &Config{Registerer: reg, Logger: testLogger(), Concurrency: 100}, instances)
	require.NoError(t, err)
	<-read
}

// unknownWarnings counts the relay's warnings about rows for connectors it does not have.
type unknownWarnings struct{ n *atomic.Int64 }

func (h unknownWarnings) Enabled(context.Context, slog.Level) bool { return true }
func (h unknownWarnings) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h unknownWarnings) WithGroup(string) slog.Handler            { return h }

func (h unknownWarnings) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, "connectors this relay does not have") {
		h.n.Add(1)
	}
	return nil
}

// Relays that share one database with different connector instances (a payment relay
// that alone holds the Stripe key, and another for the webhooks) do not report each
// other's rows as waiting for a relay with their connector: those rows have one. The
// webhook relay used to warn every refresh, and count them in
// outboxd_unknown_connector_rows, for as long as any payment row was pending, which on
// a busy database is always. Once no running relay has the instance, its rows are
// reported again.
func TestRowsOfAnotherRunningRelaysConnectorAreNotUnknown(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "charge", "webhook:billing", []int{1})
	var warnings atomic.Int64
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: slog.New(unknownWarnings{&warnings})},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	other, err := New(pool, &Config{ID: "billing-relay", Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook:billing": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	other.seen(t.Context()) // it runs, with its instance

	r.refreshStats(t.Context())
	require.Zero(t, testutil.CollectAndCount(r.metrics.unknownConnector), "a running relay has webhook:billing")
	require.Zero(t, warnings.Load(), "nothing to warn about")
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.rows.WithLabelValues("webhook:billing", "pending")), "the row is still counted")

	other.withdraw(t.Context()) // it stopped
	r.refreshStats(t.Context())
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:billing")))
	require.Equal(t, int64(1), warnings.Load())
}

// outboxd_delivery_duration_seconds measures an attempt on the relay's own clock, not
// on its correction to the database's: a new correction while the attempt is in flight
// (readClock measures it every poll interval; after a step of the local clock, NTP or a
// VM resumed, it changes by the step) used to be added to the attempt's duration, a
// sample seconds off, or negative.
func TestDeliveryDurationIgnoresANewClockCorrection(t *testing.T) {
	t.Parallel()
	slow, release := blockingReceiver(t)
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	r, _ := start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: newHook(t, slow.URL())}})
	enqueue(t, b.pool, "timed", "webhook", []int{1})
	require.Eventually(t, func() bool { return slow.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond)

	clock.Advance(200 * time.Millisecond) // the attempt takes 200ms
	r.skew.Add(int64(3 * time.Second))    // and the correction is measured anew meanwhile
	release()
	waitStatus(t, b.pool, "timed", outbox.StatusDelivered)
	n, sum := histogramOf(t, b.registry, "outboxd_delivery_duration_seconds", "webhook")
	require.EqualValues(t, 1, n)
	require.InDelta(t, 0.2, sum, 0.001, "the attempt's own 200ms")
}

// A row that plain SQL wrote with its created_at at ±infinity, which the relay claims and
// delivers like any other (TestInfiniteTimestampsDoNotStopClaims), does not stop the row
// gauges: their refresh subtracted created_at from the clock, which PostgreSQL before 17
// refuses for an infinite timestamp, so one such row (a dead one stays for good) kept
// every gauge at its last value, or at nothing, and warned every refresh. A row created
// at -infinity is infinitely old, as PostgreSQL 17 has it.
func TestInfiniteCreationTimesDoNotStopTheRowGauges(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status, created_at)
		VALUES ('born-never', 'webhook', '{}', 'dead', '-infinity'),
		       ('born-later', 'webhook', '{}', 'pending', 'infinity'),
		       ('now', 'webhook', '{}', 'pending', now()),
		       ('crm-born-never', 'webhook:crm', '{}', 'pending', '-infinity')`)
	require.NoError(t, err)
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.refreshStats(t.Context())

	require.Zero(t, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("stats")), "the refresh succeeds")
	require.Equal(t, 2.0, testutil.ToFloat64(r.metrics.rows.WithLabelValues("webhook", "pending")))
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.rows.WithLabelValues("webhook", "dead")))
	oldest := testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook"))
	require.GreaterOrEqual(t, oldest, 0.0)
	require.False(t, math.IsInf(oldest, 0), "the row created now is the oldest with a time")
	require.True(t, math.IsInf(testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook:crm")), 1))
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")))
}

// outboxd_oldest_pending_age_seconds goes to 0 for an instance of the relay's with no
// pending row, as outboxd_rows does; its series used to vanish, so a dashboard showed
// no data and an absent() alert fired once the backlog was gone.
func TestOldestPendingAgeGoesToZero(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "waiting", "webhook", []int{1})
	cfg := &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger()}
	hook := newHook(t, "http://127.0.0.1:1/")
	r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: hook}, "webhook:idle": {Connector: hook}})
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.Equal(t, 2, testutil.CollectAndCount(r.metrics.oldestPending), "a series for each instance")
	require.Positive(t, testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook")))

	_, err = pool.Exec(t.Context(), `DELETE FROM outbox`)
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.Equal(t, 2, testutil.CollectAndCount(r.metrics.oldestPending), "the series stay")
	require.Zero(t, testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook")))
}

// outboxd_oldest_pending_age_seconds counts a row from its creation, scheduled for later
// or not: one intent sent with a not_before a day ahead kept an alert on it firing all
// day. outboxd_oldest_due_wait_seconds counts a row from when it fell due, so rows in a
// retry's backoff or scheduled for later do not count until then.
func TestOldestDueWaitCountsRowsOnceDue(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	_, err := pool.Exec(t.Context(), `
		INSERT INTO outbox (idempotency_key, connector, payload, created_at, next_attempt_at)
		VALUES ('tomorrow', 'webhook', '{}', $1::timestamptz - interval '1 hour', $1::timestamptz + interval '1 day'),
		       ('due', 'webhook', '{}', $1::timestamptz - interval '90 seconds', $1::timestamptz - interval '20 seconds'),
		       ('backoff', 'webhook:crm', '{}', $1::timestamptz - interval '10 minutes', $1::timestamptz + interval '5 minutes')`, t0)
	require.NoError(t, err)
	r, err := New(pool, &Config{NowFunc: func() time.Time { return t0 }, Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.Equal(t, 3600.0, testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook")))
	require.Equal(t, 20.0, testutil.ToFloat64(r.metrics.oldestDueWait.WithLabelValues("webhook")), "the due row, not the one scheduled for tomorrow")
	require.Equal(t, 600.0, testutil.ToFloat64(r.metrics.oldestPending.WithLabelValues("webhook:crm")))
	require.Zero(t, testutil.ToFloat64(r.metrics.oldestDueWait.WithLabelValues("webhook:crm")), "in its backoff, not due")
}

// Refreshes of the row gauges at once (maintain's, and a test's beside a running relay)
// take turns: each writes the oldest-pending ages and the connectors last warned about.
func TestStatsRefreshesAtOnceTakeTurns(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "p1", "webhook", []int{1})
	enqueue(t, pool, "crm", "webhook:crm", []int{2})
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 20 {
				r.refreshStats(t.Context())
			}
		})
	}
	wg.Wait()
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")))
}
