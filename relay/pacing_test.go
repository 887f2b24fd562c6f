package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A row whose worker waits for a delivery slot, held by another instance's slow attempt,
// is handed back once it can no longer start well inside its lease, while the slot is
// still held: it used to wait for the slot with no bound, so a slot held for longer than
// the row's lease (a slow attempt, or several queued for the slot before it) let the
// lease run out under a row that was never sent, which then came back as an ambiguous
// attempt (held for an operator on a hold instance, dead on its last attempt).
func TestRowWaitingForASlotIsHandedBackWhileTheSlotIsHeld(t *testing.T) {
	t.Parallel()
	slowHook, slow, release := newSlowHook(t)
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Concurrency = 1
	cfg.Lease = 6 * time.Second // the webhook hook's 5s limit leaves a row 500ms to start
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook},
	})
	require.Equal(t, 500*time.Millisecond, r.instances["webhook"].startBy)

	waitBehindSlowAttempt(t, b, slow, "waits")
	clock.Advance(time.Second) // past the row's 500ms, well inside its 6s lease
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.handedBack) >= 1 }, waitTimeout, 10*time.Millisecond,
		"the row is handed back while the slow attempt still holds the slot")
	require.Equal(t, 1, slow.TotalEffects(), "the slow attempt is still in flight")

	release()
	in := waitStatus(t, b.pool, "waits", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts, "the wait was not counted as an attempt")
	require.Equal(t, 1, b.receiver.Effects("waits"))
	for _, a := range attemptsOf(t, b.pool, "waits") {
		require.NotEqual(t, "lease_expired", a.Outcome)
	}
}

// pacedConnector records the relay's clock at every delivery and holds the first one
// until gate is closed. It declares a time limit, so rows are claimed ahead of its
// workers.
type pacedConnector struct {
	clock   *testClock
	mu      sync.Mutex
	at      []time.Time
	once    sync.Once
	started chan struct{}
	gate    chan struct{}
}

func (c *pacedConnector) Deliver(context.Context, connectors.Delivery) (json.RawMessage, error) {
	c.mu.Lock()
	c.at = append(c.at, c.clock.Now())
	c.mu.Unlock()
	c.once.Do(func() {
		close(c.started)
		<-c.gate
	})
	return json.RawMessage(`{"ok":true}`), nil
}

func (c *pacedConnector) Guarantee() connectors.Guarantee { return connectors.Enforced }
func (c *pacedConnector) Timeout() time.Duration          { return time.Second }

func (c *pacedConnector) times() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.at)
}

// pacedSetup enqueues n rows for a relay whose one instance, webhook, is c (which holds
// each request at its gate until the gate closes), at one request a second and one at a
// time, and starts that instance's worker; it stops, and the gate closes, when the test
// ends.
func pacedSetup(t *testing.T, n int) (clock *testClock, c *pacedConnector, r *Relay, inst *instance) {
	t.Helper()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	c = &pacedConnector{clock: clock, started: make(chan struct{}), gate: make(chan struct{})}
	t.Cleanup(func() { closeOnce(c.gate) })
	for i := range n {
		enqueue(t, b.pool, fmt.Sprint("paced-", i), "webhook", []int{i})
	}
	r, err := New(b.pool, cfg, map[string]Instance{"webhook": {Connector: c, Concurrency: 1, Rate: 1}})
	require.NoError(t, err)
	inst = r.instances["webhook"]
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	var worker sync.WaitGroup
	worker.Go(func() { r.work(ctx, ctx, inst) })
	t.Cleanup(func() {
		cancel()
		close(inst.jobs)
		worker.Wait()
	})
	return clock, c, r, inst
}

// A rate-limited instance's requests are paced even when its receiver answers slowly for
// a while: the relay used to go on claiming rows ahead at the rate while the workers were
// busy, and once the slow answer came, the workers sent every row waiting at once, a
// burst the receiver's own limit answers with 429. Rate 1 with a burst of 1: no two
// requests less than a second apart (on the relay's clock).
func TestRateLimitPacesRequestsAfterASlowAnswer(t *testing.T) {
	t.Parallel()
	clock, c, r, inst := pacedSetup(t, 4)
	idle := func() {
		t.Helper()
		require.Eventually(t, func() bool { return inst.claimed.Load() == 0 }, waitTimeout, 10*time.Millisecond)
	}

	require.Equal(t, 1, claimOnce(t, r))
	waitFor(t, c.started, "the first request is in flight")
	// The receiver takes three seconds to answer; the relay's rounds go on meanwhile.
	for range 3 {
		clock.Advance(time.Second)
		claimOnce(t, r)
	}
	closeOnce(c.gate)
	idle()
	for i := 0; len(c.times()) < 4; i++ {
		require.Less(t, i, 20, "every row is delivered in the end")
		if claimOnce(t, r) == 0 {
			clock.Advance(time.Second)
		}
		idle()
	}

	at := c.times()
	for i := 1; i < len(at); i++ {
		require.GreaterOrEqual(t, at[i].Sub(at[i-1]), time.Second, "requests %d and %d at rate 1/s: %v", i-1, i, at)
	}
}

// One slow receiver does not starve the others, with every instance's concurrency left
// at its default (Config.Concurrency): the slow instance's attempts used to take every
// slot, and another instance's rows waited for one of them to end (up to its time
// limit). Each instance now keeps a slot to itself.
func TestSlowInstanceLeavesASlotForEachOther(t *testing.T) {
	t.Parallel()
	slowHook, slow, release := newSlowHook(t)
	b := setup(t, receiver.Options{})
	cfg := b.fastConfig()
	cfg.Concurrency = 4
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook},
	})
	for i := range 10 {
		enqueue(t, b.pool, fmt.Sprintf("slow-%d", i), "webhook:slow", []int{i})
	}
	require.Eventually(t, func() bool { return slow.TotalEffects() >= 3 }, waitTimeout, 10*time.Millisecond,
		"the slow instance takes the slots")
	for i := range 5 {
		enqueue(t, b.pool, fmt.Sprintf("fast-%d", i), "webhook", []int{i})
	}
	for i := range 5 {
		waitStatus(t, b.pool, fmt.Sprintf("fast-%d", i), outbox.StatusDelivered)
	}
	require.Equal(t, 3, slow.TotalEffects(), "the slow instance took every slot but the one kept for the other, and still holds them")
	require.Equal(t, 3.0, testutil.ToFloat64(r.metrics.inFlight), "their slots counted as in flight")
	release()
	for i := range 10 {
		waitStatus(t, b.pool, fmt.Sprintf("slow-%d", i), outbox.StatusDelivered)
	}
}

// An instance claims no more rows than it can have in flight. With its slot kept for
// each instance, one can hold the shared slots and its own, not Config.Concurrency, and
// its Concurrency defaulted to Config.Concurrency all the same: while its attempts held
// every slot it may take, a worker sat on a claimed row that only those attempts'
// end could let go, handed it back after startBy, claimed it again, and so on. A row of
// a hold instance claimed that way comes back held, for a person, should the relay die.
func TestInstanceClaimsNoMoreRowsThanItsSlots(t *testing.T) {
	t.Parallel()
	rcv, release := blockingReceiver(t)
	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Timeout: time.Hour})
	require.NoError(t, err)
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t) // the clock stands still: no row waits out its startBy
	cfg.Concurrency = 4
	cfg.Lease = 2 * time.Hour
	for i := range 6 {
		enqueue(t, b.pool, fmt.Sprintf("slow-%d", i), "webhook:slow", []int{i})
	}
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: hook, OnAmbiguous: AmbiguousHold}, // no rows ahead
	})
	t.Cleanup(release) // before the relay stops
	require.Eventually(t, func() bool { return rcv.TotalEffects() == 3 }, waitTimeout, 10*time.Millisecond,
		"the two shared slots and its own")
	require.Equal(t, 3, countStatus(t, b.pool)[outbox.StatusDelivering], "no row is claimed that no slot can take")
	require.EqualValues(t, 3, r.instances["webhook:slow"].claimed.Load())
	release()
	for i := range 6 {
		waitStatus(t, b.pool, fmt.Sprintf("slow-%d", i), outbox.StatusDelivered)
	}
}

// A rate-limited instance's requests are paced on the uncorrected clock, not on its
// reading corrected to the database's: the correction, measured again every poll
// interval, moves when the database's clock steps (NTP, a VM resumed) or a reading
// comes back slowly, and the limiter, read on the corrected clock, took a step forward
// for time gone by and let a request go at once after the last, at rate 1/s.
func TestRateLimitIgnoresTheDatabaseClockCorrection(t *testing.T) {
	t.Parallel()
	clock, c, r, inst := pacedSetup(t, 2)
	closeOnce(c.gate) // no request is held

	require.Equal(t, 1, claimOnce(t, r))
	require.Eventually(t, func() bool { return inst.claimed.Load() == 0 }, waitTimeout, 10*time.Millisecond)
	r.skew.Add(int64(time.Second)) // the database's clock stepped a second ahead
	require.Zero(t, claimOnce(t, r), "no token for a second on the relay's clock: requests at %v", c.times())
	clock.Advance(time.Second)
	require.Equal(t, 1, claimOnce(t, r))
}
