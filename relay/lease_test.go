package relay

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A connector whose time limit leaves its rows less than 2*minStartBy of the lease
// (allowed: OUTBOX_*_TIMEOUT only has to be shorter than OUTBOX_LEASE) must still start
// an attempt only while it can end inside the lease. Here the row waits 1s for the one
// delivery slot; its attempt may then run 5.9s, until 0.9s after the lease ran out, when
// another relay reclaims the row and sends it again while this attempt is still on its
// way (invariant b).
func TestAttemptStartsOnlyWhileItCanEndInsideItsLease(t *testing.T) {
	t.Parallel()
	slow, release := blockingReceiver(t)
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Concurrency = 1
	cfg.Lease = 6 * time.Second
	tight, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Enforced, Timeout: cfg.Lease - 100*time.Millisecond})
	require.NoError(t, err)
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: tight},
		"webhook:slow": {Connector: newHook(t, slow.URL())},
	})
	waitBehindSlowAttempt(t, b, slow, "waits")
	clock.Advance(time.Second)
	release()

	waitStatus(t, b.pool, "waits", outbox.StatusDelivered)
	var waited time.Duration
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT max(a.started_at - o.first_attempt_at)
		FROM outbox o JOIN outbox_attempts a ON a.outbox_id = o.id WHERE o.idempotency_key = 'waits' GROUP BY o.id`).Scan(&waited))
	require.LessOrEqual(t, waited+tight.Timeout(), cfg.Lease,
		"the attempt started %s after its claim, so it could run %s past its lease", waited, waited+tight.Timeout()-cfg.Lease)
	require.LessOrEqual(t, r.instances["webhook"].startBy+tight.Timeout(), cfg.Lease,
		"a row may start no later than its attempt can still end inside its lease")
}

// A row whose relay lost its lease is put back for another attempt at the reclaim's
// time; when that is later than the row's maximum age, it must go to dead, as decide
// does for a retry that would come after it (invariant d). Each instance's own maximum
// age counts.
func TestReclaimHonoursMaxAge(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Lease = 10 * time.Second
	instances := map[string]Instance{
		"webhook":       {Connector: b.hook, MaxAge: time.Hour},
		"webhook:young": {Connector: b.hook}, // Config.MaxAge: 72h
	}
	sender, other := newRelayAs(t, b, cfg, instances, "sender"), newRelayAs(t, b, cfg, instances, "other")
	enqueue(t, b.pool, "old", "webhook", []int{1})
	enqueue(t, b.pool, "young", "webhook:young", []int{1})
	require.Len(t, claimRows(t, sender, "webhook"), 1)
	require.Len(t, claimRows(t, sender, "webhook:young"), 1)

	// The sender vanishes; its leases run out, and the other relay finds them two hours
	// after the rows were created.
	clock.Advance(2 * time.Hour)
	other.reclaim(t.Context())

	young, err := outbox.Get(t.Context(), b.pool, "young")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, young.Status, "within its 72h, the row is retried")
	old, err := outbox.Get(t.Context(), b.pool, "old")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDead, old.Status, "a retry now would come after the row's maximum age of 1h")
	require.Contains(t, old.LastError, "maximum age")
	require.Empty(t, claimRows(t, other, "webhook"), "no attempt after the maximum age")
}

// A stopping relay hands back the rows it will never start at once, not only after the
// last delivery in flight has ended: that may take up to the connectors' time limit,
// and meanwhile the rows' leases run out, and another relay puts them away as if an
// attempt had been made and lost: ambiguous, held for an operator under the hold
// policy, or dead when it was their last attempt (invariants b, d). Here a row waits
// for the one delivery slot, held by another instance's slow attempt, when the relay
// is told to stop; its only allowed attempt must not be used up without a send.
func TestStopHandsBackRowsWaitingForASlotAtOnce(t *testing.T) {
	t.Parallel()
	slowHook, slow, release := newSlowHook(t)
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Concurrency, cfg.MaxAttempts = 1, 1
	cfg.Lease, cfg.ShutdownTimeout = 2*time.Hour, time.Hour
	instances := map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook},
	}
	a, stopA := start(t, b.pool, cfg, instances)
	c := *cfg
	c.ID, c.Registerer = "other", prometheus.NewRegistry()
	other, err := New(b.pool, &c, instances)
	require.NoError(t, err)

	waitBehindSlowAttempt(t, b, slow, "waits")
	require.Eventually(t, func() bool { return len(wakeRows(t, b, a.ID())) > 0 }, waitTimeout, 10*time.Millisecond,
		"the relay's words in outbox_wake_connectors, which its claim loop withdraws as it ends")

	stopped := make(chan struct{})
	go func() { stopA(); close(stopped) }()
	// The fixed relay releases the row within milliseconds; a broken one releases it
	// only after the slow attempt, which the test ends below, so it fails at any bound:
	// waitTimeout, not a shorter one that a busy machine could exceed.
	assert.Eventually(t, func() bool {
		in, err := outbox.Get(t.Context(), b.pool, "waits")
		return err == nil && in.Status == outbox.StatusPending
	}, waitTimeout, 10*time.Millisecond, "the row the stopping relay will never start is handed back at once")
	// A claim round that began before the stop may take the row again and hand it back
	// only as it ends; once the claim loop has ended, none can.
	require.Eventually(t, func() bool { return len(wakeRows(t, b, a.ID())) == 0 }, waitTimeout, 10*time.Millisecond,
		"the stopping relay's claim loop ended")

	// The slow attempt is still in flight when the leases run out and the other relay
	// reclaims expired leases.
	clock.Advance(cfg.Lease + time.Second)
	other.reclaim(t.Context())
	release()
	<-stopped

	in, err := outbox.Get(t.Context(), b.pool, "waits")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status, "never sent, so not put away as a lost attempt: %s", in.LastError)
	require.Zero(t, in.Attempts)
	require.Empty(t, attemptsOf(t, b.pool, "waits"))
	require.Zero(t, b.receiver.Effects("waits"))
}

// newRelayAs is a relay with cfg and instances under its own id and metrics registry, not
// running: a test drives its claims and reclaims.
func newRelayAs(t *testing.T, b *testBundle, cfg *Config, instances map[string]Instance, id string) *Relay {
	t.Helper()
	c := *cfg
	c.ID, c.Registerer = id, prometheus.NewRegistry()
	r, err := New(b.pool, &c, instances)
	require.NoError(t, err)
	return r
}

// The relay's clock steps forward and back (the database's clock, which the relay's is
// corrected to, ran an hour ahead until NTP stepped it back; or the relay's host clock
// did, until the next reading of the database's clock corrected it). The rounds claimed
// while it was ahead carry leases an hour too long; that cannot be helped. But the
// rounds claimed once the clock is right again must carry leases of OUTBOX_LEASE: a
// relay that dies then must not leave every row it claimed in the following hour
// stuck in delivering for up to an hour, as if its lease were an hour long.
func TestLeaseAfterTheClockSteppedBackIsTheConfiguredOne(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Lease = 10 * time.Second
	instances := map[string]Instance{"webhook": {Connector: b.hook}}
	sender, other := newRelayAs(t, b, cfg, instances, "sender"), newRelayAs(t, b, cfg, instances, "other")

	enqueue(t, b.pool, "while-ahead", "webhook", []int{1})
	clock.Advance(time.Hour) // the clock runs an hour ahead for a moment
	require.Len(t, claimRows(t, sender, "webhook"), 1)
	clock.Advance(-time.Hour) // and is stepped back

	enqueue(t, b.pool, "after", "webhook", []int{1})
	got := claimRows(t, sender, "webhook")
	require.Len(t, got, 1)
	require.Equal(t, "after", got[0].key)
	require.WithinDuration(t, clock.Now().Add(cfg.Lease), got[0].lease, time.Second,
		"a round claimed on the right clock is leased for OUTBOX_LEASE, not until %s", got[0].lease)

	// The sender dies; once its lease of 10s has run out, another relay puts the row back.
	clock.Advance(cfg.Lease + time.Second)
	other.reclaim(t.Context())
	in, err := outbox.Get(t.Context(), b.pool, "after")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status,
		"the dead relay's row stays delivering long after its lease should have run out")
}
