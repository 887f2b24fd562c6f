package relay

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
)

// realClockConfig is cfg for a relay that corrects its clock to the database's, as one
// on time.Now does, but whose local ("wall") clock is clock, so that a test can step it
// as NTP, a VM resume or an operator would.
func realClockConfig(cfg *Config, id string, clock *testClock) *Config {
	c := *cfg
	c.ID, c.Registerer = id, prometheus.NewRegistry()
	c.NowFunc, c.usesRealClock = clock.Now, true
	return &c
}

// dbNow reads the database's clock.
func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// A relay corrects its clock to the database's once, at start. Should its local clock
// then step (NTP stepping a clock that was off, a VM resumed, an operator), or the
// database's, its correction is wrong from then on: here the reclaiming relay's clock
// steps 30s ahead after start, and it takes the row another relay holds a live lease on
// (10s, with 10s still to run by the database's clock), which that relay may be sending
// right now; the row is then sent twice at once (invariant: a row is in flight in at
// most one relay).
func TestReclaimIsNotFooledByALocalClockStepAfterStart(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	cfg.Lease = 10 * time.Second
	enqueue(t, b.pool, "live", "webhook", []int{1})

	// The holder's clock is the database's (it claims with a lease to 10s from now).
	holderClock := &testClock{now: dbNow(t, b.pool)}
	hc := *cfg
	hc.ID, hc.Registerer, hc.NowFunc = "holder", prometheus.NewRegistry(), holderClock.Now
	holder := b.newRelay(t, &hc)
	require.Len(t, claimRows(t, holder, "webhook"), 1)

	// The other relay starts with its wall clock right (the database runs on this
	// machine: the same clock), and measures its correction.
	wall := &testClock{now: time.Now()}
	other := b.newRelay(t, realClockConfig(cfg, "other", wall))
	require.NoError(t, other.start(t.Context()))

	// Its wall clock steps 30s ahead; little time passes by the database's clock.
	wall.Advance(30 * time.Second)
	other.reclaim(t.Context())

	var status, owner string
	require.NoError(t, b.pool.QueryRow(t.Context(),
		`SELECT status, coalesce(lease_owner, '') FROM outbox WHERE idempotency_key = 'live'`).Scan(&status, &owner))
	require.Equal(t, "delivering", status, "a lease with about 10s to run by the database's clock was taken: %v", attemptsOf(t, b.pool, "live"))
	require.Equal(t, "holder", owner)
	require.WithinDuration(t, dbNow(t, b.pool), other.now(), 5*time.Second,
		"the relay's clock follows the database's after its local clock stepped")
}

// The correction to the database's clock is measured over a round trip whose middle is
// taken as the moment the database read its clock. At start the pool has no connection
// yet, so that round trip includes connecting (TCP, TLS, authentication; a database just
// starting up, which is when start retries), and the correction is off by half of it.
// Here connecting takes 10s (the injected clock moves while it dials); the relay's clock
// then runs 5s ahead of the database's, enough for it to reclaim live leases of other
// relays, or (off the other way) to write leases that others see expire early.
func TestClockCorrectionLeavesOutTheConnect(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	wall := &testClock{now: time.Now()}
	pc := b.pool.Config()
	dialer := &net.Dialer{}
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		wall.Advance(10 * time.Second) // a slow connect, on the relay's clock
		return dialer.DialContext(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	r, err := New(pool, realClockConfig(b.fastConfig(), "slowdial", wall), map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	// wall moves only while dialling, so the relay's clock is the database's as start
	// read it: between the database's clock before and after, however long start took.
	before := dbNow(t, b.pool)
	require.NoError(t, r.start(t.Context()))
	require.WithinRange(t, r.now(), before, dbNow(t, b.pool),
		"the correction is measured over the query alone, not the connect")
}

// The relay reads the database's clock with the simple protocol, whose results are
// text, and text timestamps follow the session's DateStyle. A database (or role, or
// DSN options) set to a non-ISO DateStyle, which the extended protocol's binary
// results never cared about, made every readClock fail: the relay could not start,
// and (once running) reclaim skipped every poll.
func TestClockReadWithNonISODateStyle(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	pc := b.pool.Config()
	pc.ConnConfig.RuntimeParams["datestyle"] = "SQL, DMY"
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	wall := &testClock{now: dbNow(t, b.pool)}
	r, err := New(pool, realClockConfig(b.fastConfig(), "datestyle", wall), map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	require.NoError(t, r.readClock(t.Context()), "the clock is read whatever the session's DateStyle")
}

// clockReadDelay makes a relay's next read of the database's clock come back late: after
// the database has read its clock, the reply takes delay more, on the relay's clock
// (a stalled network, a retransmitted packet, the relay's process paused). The test
// does not wait for it, so the database's clock does not move meanwhile: wall stands
// for both clocks once the delay has passed.
type clockReadDelay struct {
	wall  *testClock
	delay time.Duration
	armed atomic.Bool
}

func (d *clockReadDelay) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (d *clockReadDelay) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err == nil && d.armed.CompareAndSwap(true, false) {
		d.wall.Advance(d.delay)
	}
}

// The correction to the database's clock takes the middle of the read's round trip as
// the moment the database read its clock, so it is off by up to half the round trip.
// A round trip of 20s (the reply held up after the database answered) put the relay's
// clock 10s behind: for a poll interval its leases were 10s short, and others took its
// rows while it sent them; off the other way, it would take others' live leases. A
// reading that slow says little: the relay keeps the correction it had, moved only as
// far as the reading shows it wrong (here, after a step of the local clock).
func TestSlowClockReadDoesNotSkewTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	started := func(t *testing.T, id string) (*Relay, *testClock, *clockReadDelay) {
		t.Helper()
		wall := &testClock{now: dbNow(t, b.pool)}
		slow := &clockReadDelay{wall: wall}
		pc := b.pool.Config()
		pc.ConnConfig.Tracer = slow
		pool, err := pgxpool.NewWithConfig(t.Context(), pc)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		r, err := New(pool, realClockConfig(b.fastConfig(), id, wall), map[string]Instance{"webhook": {Connector: b.hook}})
		require.NoError(t, err)
		// wall stands still, so the relay's clock is the database's as start read it:
		// between the database's clock before and after, however long start took.
		before := dbNow(t, b.pool)
		require.NoError(t, r.start(t.Context()))
		require.WithinRange(t, r.now(), before, dbNow(t, b.pool))
		return r, wall, slow
	}
	// readSlowly returns the database's clock just before and just after the reading.
	readSlowly := func(t *testing.T, r *Relay, slow *clockReadDelay, delay time.Duration) (before, after time.Time) {
		t.Helper()
		slow.delay = delay
		slow.armed.Store(true)
		before = dbNow(t, b.pool)
		require.NoError(t, r.readClock(t.Context()))
		after = dbNow(t, b.pool)
		require.False(t, slow.armed.Load(), "the clock was read")
		return before, after
	}

	r, wall, slow := started(t, "slowread")
	// The correction start measured: the database's time gone by since wall was read,
	// the relay's start included, which a busy machine can make a second or more.
	had := r.now().Sub(wall.Now())
	readSlowly(t, r, slow, 20*time.Second)
	require.WithinDuration(t, wall.Now().Add(had), r.now(), time.Second,
		"the relay's clock, once the reply came 20s after the database read its clock")

	// The local clock steps a minute ahead; the next reading takes 2s. It shows the
	// correction a minute wrong, and within 2s where it is.
	r, wall, slow = started(t, "stepped")
	wall.Advance(time.Minute)
	before, after := readSlowly(t, r, slow, 2*time.Second)
	require.WithinRange(t, r.now(), before.Add(2*time.Second), after.Add(2*time.Second),
		"the relay's clock follows a step of the local clock, however slow the reading: the database's as it read it, 2s on")
}

// Tests put back expired leases with reclaim beside a running relay, whose own passes
// reclaim too: both read the database's clock. The flag that says the correction has
// been measured was a plain field, and the race detector failed whichever test's reclaim
// met a pass of the relay's own (a run of the package in three failed so).
func TestClockIsReadSafelyBesideARunningRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	cfg := b.fastConfig()
	cfg.PollInterval = time.Millisecond // the relay's passes, and their clock readings, back to back
	r, _ := start(t, b.pool, realClockConfig(cfg, "reader", &testClock{now: time.Now()}), map[string]Instance{"webhook": {Connector: b.hook}})
	for range 200 {
		require.NoError(t, r.readClock(t.Context()))
	}
}
