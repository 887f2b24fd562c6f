package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
)

// A failed New leaves the Registerer as it found it: the embedder can fix the input
// and call New again with the same registry.
func TestNewFailedNewLeavesRegistererClean(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	reg := prometheus.NewRegistry()
	_, err := New(pool, &Config{Registerer: reg}, map[string]Instance{"webhook": {}})
	require.ErrorContains(t, err, "has no Connector")
	_, err = New(pool, &Config{Registerer: reg}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
}

// Instance.MaxAge is refused when negative, as Config.MaxAge is.
func TestNewRejectsNegativeInstanceMaxAge(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := New(pool, nil, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/"), MaxAge: -time.Hour}})
	require.ErrorContains(t, err, "MaxAge")
}

// An instance name no outbox row can carry (the connector CHECK refuses it) is refused.
func TestNewRejectsImpossibleInstanceNames(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	for _, name := range []string{"", "Webhook", "webhook:", ":x", "webhook:a:b", strings.Repeat("w", 101)} {
		_, err := New(pool, nil, map[string]Instance{name: {Connector: newHook(t, "http://127.0.0.1:1/")}})
		require.Error(t, err, "name %q", name)
	}
}

// BackoffBase above the default BackoffMax is refused, as it is against an explicit one.
func TestNewBackoffBaseAboveDefaultMax(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := New(pool, &Config{BackoffBase: 2 * time.Hour}, nil)
	require.ErrorContains(t, err, "BackoffBase")
}

// BackoffMax below the default BackoffBase is refused too: accepted, every retry came
// at exactly BackoffMax (the base, jittered, always above the cap), without jitter, so
// rows that failed together came back together, and without the doubling.
func TestNewBackoffMaxBelowDefaultBase(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := New(pool, &Config{BackoffMax: 500 * time.Millisecond}, nil)
	require.ErrorContains(t, err, "BackoffBase (1s) must not exceed BackoffMax (500ms)")
}

// Rate +Inf is refused like NaN.
func TestNewRejectsInfiniteRate(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := New(pool, nil, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/"), Rate: posInf()}})
	require.Error(t, err)
}

// Running a relay a second time returns an error rather than panicking.
func TestNewRunTwice(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	r, err := New(pool, &Config{Logger: testLogger(), PollInterval: 10 * time.Millisecond, ShutdownTimeout: time.Second}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	// The first Run is stopped only once it has started: stopped by a timeout while it
	// still waited for the database (a busy machine), it would leave the relay free to
	// run again, and the second Run below would rightly succeed.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	require.Eventually(t, r.running.Load, waitTimeout, 10*time.Millisecond, "the first Run never started")
	cancel()
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("the first Run did not stop")
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel2()
	var perr any
	func() {
		defer func() { perr = recover() }()
		err = r.Run(ctx2)
	}()
	require.Nil(t, perr, "second Run panicked: %v", fmt.Sprint(perr))
	require.Error(t, err)
}

func posInf() float64 { var z float64; return 1 / z }

// Run after a start that failed (stopped before the database answered) may run again.
func TestNewRunAfterFailedStart(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	r, err := New(pool, &Config{Logger: testLogger(), ShutdownTimeout: time.Second}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	stopped, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, r.Run(stopped))
	ctx, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	require.NoError(t, r.Run(ctx))
}

// A server older than PostgreSQL 14 is refused at start with one clear sentence: the
// claim needs pg_column_compression, and would otherwise fail in every round.
func TestCheckServerVersion(t *testing.T) {
	t.Parallel()
	require.NoError(t, checkServerVersion(140000))
	require.NoError(t, checkServerVersion(170004))
	require.EqualError(t, checkServerVersion(130016),
		"relay: the database runs PostgreSQL 13.16, and the relay needs PostgreSQL 14 or later")
	// Before PostgreSQL 10 the version had three parts (90624 is 9.6.24), not "9.624".
	require.EqualError(t, checkServerVersion(90624),
		"relay: the database runs PostgreSQL 9.6.24, and the relay needs PostgreSQL 14 or later")
}

// PostgreSQL restarts while the relay starts: the connection it reached the database on
// breaks just after, as it reads the server's version. Only the first statement was
// retried, so Run failed ("relay: read the server's version: ...") and serve exited 1,
// rather than waiting for the database as it does when the first statement fails.
func TestRunStartsThroughARestartAfterTheFirstStatement(t *testing.T) {
	t.Parallel()
	_, proxy, cfg, _ := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	held, release := proxy.holdOnce(t, "server_version_num")
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()

	waitFor(t, held, "the relay never read the server's version")
	proxy.cut() // PostgreSQL restarts
	release()
	proxy.restore()
	deadline := time.After(waitTimeout)
	for r.Ready(t.Context()) != nil {
		select {
		case err := <-ran:
			t.Fatalf("Run returned at start: %v", err)
		case <-deadline:
			t.Fatal("the relay did not start once the database was back")
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	require.NoError(t, <-ran)
}

// While Run waits for its database at start (up to 30s, logging nothing), /readyz is
// where an operator looks. It said "relay is not running", as before Run or after it
// returned; it now says the relay is starting, and why it cannot yet.
func TestReadyWhileStartingSaysWhy(t *testing.T) {
	t.Parallel()
	r := unreachableRelay(t)
	require.EqualError(t, r.Ready(t.Context()), "relay is not running")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()

	require.Eventually(t, r.runCalled.Load, waitTimeout, time.Millisecond)
	err := r.Ready(t.Context())
	require.ErrorContains(t, err, "relay is starting: database unreachable: ")
	cancel()
	require.NoError(t, <-ran)
	require.EqualError(t, r.Ready(t.Context()), "relay is not running")
}

// guaranteed is a connector that declares guarantee g and delivers nothing.
type guaranteed struct{ g connectors.Guarantee }

func (c guaranteed) Deliver(context.Context, connectors.Delivery) (json.RawMessage, error) {
	return nil, nil
}
func (c guaranteed) Guarantee() connectors.Guarantee { return c.g }

// A connector whose Guarantee is none of the three (left empty, or misspelt) is refused:
// the relay read it as enforced and retried its ambiguous attempts blindly, even with
// the hold policy, when the receiver may not dedupe at all.
func TestNewRejectsUnknownGuarantee(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	for _, g := range []connectors.Guarantee{"", "Forwarded", "exactly-once"} {
		_, err := New(pool, nil, map[string]Instance{"webhook:own": {Connector: guaranteed{g}, OnAmbiguous: AmbiguousHold}})
		require.ErrorContains(t, err, `relay: connector instance "webhook:own": its Guarantee is `, "guarantee %q", g)
	}
	for _, g := range []connectors.Guarantee{connectors.Enforced, connectors.Reconciled, connectors.Forwarded} {
		_, err := New(pool, &Config{Registerer: prometheus.NewRegistry()}, map[string]Instance{"webhook:own": {Connector: guaranteed{g}}})
		require.NoError(t, err, "guarantee %q", g)
	}
}

// An ID PostgreSQL cannot store as text is refused: the relay started, said it was
// ready, and failed every claim ("invalid byte sequence for encoding UTF8"), delivering
// nothing.
func TestNewRejectsUnstorableID(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	for _, id := range []string{"relay\x00a", "relay-\xff"} {
		_, err := New(pool, &Config{ID: id}, nil)
		require.ErrorContains(t, err, "relay config: ID must be UTF-8 text without NUL", "id %q", id)
	}
	// A longer one broke the relay's row in outbox_wake_connectors (past 2.7 kB: the
	// primary key's entry) and its NOTIFY self-test (past 8 kB: the payload).
	_, err := New(pool, &Config{ID: strings.Repeat("r", 256)}, nil)
	require.ErrorContains(t, err, "relay config: ID must be at most 255 bytes, got 256")
	_, err = New(pool, &Config{ID: strings.Repeat("é", 127)}, nil)
	require.NoError(t, err)
}

// A Concurrency beyond what the relay can allocate queues for is refused with an error
// naming it: New panicked ("makechan: size out of range"), or took so much memory for
// its queues that the process died before it said a word.
func TestNewRejectsHugeConcurrency(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	for _, n := range []int{10001, 1 << 40} {
		require.NotPanics(t, func() {
			_, err := New(pool, &Config{Concurrency: n}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
			require.ErrorContains(t, err, fmt.Sprintf("relay config: Concurrency must be at most 10000, got %d", n))
		})
	}
	_, err := New(pool, &Config{Concurrency: 10000}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
}

// MaxAttempts beyond an int4 (math.MaxInt, say, for "never give up on attempts") is
// refused: the reclaim sends it as a parameter compared with the attempts column, and
// failed in every poll ("greater than maximum value for int4"), so the rows of a relay
// that died stayed delivering for ever.
func TestNewRejectsMaxAttemptsBeyondInt4(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := New(pool, &Config{MaxAttempts: math.MaxInt}, nil)
	require.ErrorContains(t, err, "relay config: MaxAttempts must be at most 2147483647")
	_, err = New(pool, &Config{MaxAttempts: math.MaxInt32}, nil)
	require.NoError(t, err)
}

// A Rate too large to matter (beyond what an int holds, a tenth of it) is no limit: its
// burst overflowed to one row, and the instance was claimed one row per round.
func TestNewHugeRateClaimsFullBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook, Rate: 1e20}})
	require.NoError(t, err)
	for i := range 10 {
		enqueue(t, b.pool, fmt.Sprint("k", i), "webhook", []int{i})
	}
	require.Equal(t, 10, claimOnce(t, r))
}

// retryUnlessRefused retries what waiting may cure, and an error that carries no
// SQLSTATE (a pooler's, say) rather than panicking on it.
func TestRetryUnlessRefused(t *testing.T) {
	t.Parallel()
	retried := func(err error) bool {
		return errors.Is(retryUnlessRefused(err), err) && retryUnlessRefused(err) != err
	}
	for _, code := range []string{"08006", "53300", "57P01", "57P03", "", "X"} {
		require.True(t, retried(&pgconn.PgError{Code: code}), "code %q", code)
	}
	for _, code := range []string{"42501", "42P01", "28P01"} {
		require.False(t, retried(&pgconn.PgError{Code: code}), "code %q", code)
	}
	require.True(t, retried(io.ErrUnexpectedEOF))
}

// A Relay runs once, and Run's second call says to create another with New. With the
// application's own Registerer (the one its /metrics serves), that New failed: the
// stopped relay's series were still registered ("duplicate metrics collector
// registration attempted"). The new relay now takes their place, and the registry
// reports its series.
func TestNewAfterStoppedRelayOnSameRegisterer(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	reg := prometheus.NewRegistry()
	cfg := &Config{Logger: testLogger(), Registerer: reg, ShutdownTimeout: time.Second}
	instances := map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}}
	first, stop := start(t, pool, cfg, instances)
	require.Eventually(t, func() bool { return first.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	stop()

	second, err := New(pool, cfg, instances)
	require.NoError(t, err, "a relay made after the first stopped, on the same Registerer")
	second.claimedRows.Store(7)
	families, err := reg.Gather()
	require.NoError(t, err)
	var claimed []float64
	for _, mf := range families {
		if mf.GetName() == "outboxd_claimed_rows" {
			for _, m := range mf.GetMetric() {
				claimed = append(claimed, m.GetGauge().GetValue())
			}
		}
	}
	require.Equal(t, []float64{7}, claimed, "the registry reports the new relay's series")

	// So does one made after a Run that could not start (an application that makes a
	// new relay when Run fails).
	stopped, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, second.Run(stopped))
	_, err = New(pool, cfg, instances)
	require.NoError(t, err, "a relay made after the second's Run returned at start")
}

// Two relays that may both run cannot share a Registerer: New refuses the second, and
// its error says why and what to do, not only prometheus' "duplicate metrics collector
// registration attempted", which leaves an application to guess whose.
func TestNewTwoLiveRelaysOnOneRegisterer(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	reg := prometheus.NewRegistry()
	instances := map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}}
	_, err := New(pool, &Config{Logger: testLogger(), Registerer: reg}, instances)
	require.NoError(t, err)
	_, err = New(pool, &Config{Logger: testLogger(), Registerer: reg}, instances)
	require.ErrorContains(t, err, "another relay that has not stopped uses this Registerer")
	require.ErrorContains(t, err, "prometheus.WrapRegistererWith")
	var dup prometheus.AlreadyRegisteredError
	require.ErrorAs(t, err, &dup)

	// Each wrapped with a label of its own, as the error says, their series stand side by side.
	reg = prometheus.NewRegistry()
	for _, name := range []string{"first", "second"} {
		_, err = New(pool, &Config{Logger: testLogger(), Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"relay": name}, reg)}, instances)
		require.NoError(t, err)
	}
}

// The payment, email and slack connectors built from code with their defaults have a
// time limit of 30s, and a zero Config's lease was 30s too: the configuration Lease's
// doc warns of (and outboxd serve refuses), where an attempt that starts after its row
// waited for a slot, and takes its time limit, outlives its lease, and another relay
// sends the row again meanwhile. Left zero, the lease now leaves a second beyond the
// longest time limit, and every attempt that starts in time ends inside its lease.
func TestNewDefaultLeaseCoversConnectorDefaults(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	pay, err := payment.New(payment.Config{APIKey: "sk_test_123"})
	require.NoError(t, err)
	mail, err := email.New(email.Config{Addr: "127.0.0.1:1", From: "shop@example.com"})
	require.NoError(t, err)
	chat, err := slack.New(slack.Config{Token: "xoxb-1"})
	require.NoError(t, err)
	r, err := New(pool, &Config{Logger: testLogger()}, map[string]Instance{
		"payment": {Connector: pay}, "email": {Connector: mail}, "slack": {Connector: chat},
		"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")},
	})
	require.NoError(t, err)
	for name, inst := range r.instances {
		timeout := connectors.Timeout(inst.conn)
		require.Positive(t, timeout, name)
		require.LessOrEqual(t, inst.startBy+timeout, r.cfg.Lease,
			"%s: an attempt started %s after its claim and taking its time limit of %s ends inside the lease", name, inst.startBy, timeout)
	}

	// A lease set explicitly is kept, as are the defaults' 30s with shorter time limits.
	r, err = New(pool, &Config{Logger: testLogger(), Lease: 45 * time.Second}, map[string]Instance{"payment": {Connector: pay}})
	require.NoError(t, err)
	require.Equal(t, 45*time.Second, r.cfg.Lease)
	r, err = New(pool, &Config{Logger: testLogger()}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, r.cfg.Lease)
}

// The hold policy is for forwarded receivers: set on an instance whose connector
// enforces the key, it does nothing, and New says so once (taken silently, an operator
// who set OUTBOX_WEBHOOK_ON_AMBIGUOUS=hold with GUARANTEE=enforced waited for held rows
// that never came).
func TestNewWarnsOfHoldOnAnInstanceNotForwarded(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	var logs bytes.Buffer
	forwarded, err := webhook.New(webhook.Config{URL: "http://127.0.0.1:1/", Guarantee: connectors.Forwarded})
	require.NoError(t, err)
	_, err = New(pool, &Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, map[string]Instance{
		"webhook":     {Connector: newHook(t, "http://127.0.0.1:1/"), OnAmbiguous: AmbiguousHold},
		"webhook:fwd": {Connector: forwarded, OnAmbiguous: AmbiguousHold},
	})
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(logs.String(), "OnAmbiguous hold has no effect"), logs.String())
	require.Contains(t, logs.String(), "connector=webhook guarantee=enforced")
}
