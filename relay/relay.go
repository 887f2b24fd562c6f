package relay

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sethvargo/go-retry"
	"golang.org/x/time/rate"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/replaylock"
	"github.com/outboxd/outboxd/outbox"
)

// Relay claims due rows from the outbox table, delivers them through connectors and
// records the outcomes. Any number of relays may share one database.
type Relay struct {
	pool      *pgxpool.Pool
	cfg       *Config
	log       *slog.Logger
	metrics   *metrics
	trouble   trouble // database work that keeps failing (see failed)
	instances map[string]*instance
	names     []string  // instance names, sorted
	hold      []string  // forwarded instances whose ambiguous attempts are held
	maxAges   []float64 // each instance's maximum age in seconds, in the order of names

	wake      chan struct{} // a NOTIFY arrived, or something else worth a claim
	slotFreed chan struct{} // a claimed row finished, or was handed back
	results   chan outcome
	// claimedRows counts rows claimed and not finished (waiting for a worker or in
	// flight), at most maxClaimed and one row per instance (see share); slots holds a
	// token per delivery in flight in the slots the instances share (see reserveSlots),
	// and ownSlots one in each instance's own slot (their instance.ownSlot), made before
	// the in-flight gauge that reads them is registered.
	claimedRows atomic.Int64
	// claimedOrdered counts those of them that have an ordering key, and orderedClaims
	// every such row claimed, up to orderedClaimsParked when the last parking pass
	// behind rows in flight began (-1 when it failed): that pass has nothing to do while
	// there are none, and none were claimed since the last (see parkInFlight).
	claimedOrdered      atomic.Int64
	orderedClaims       atomic.Int64
	orderedClaimsParked atomic.Int64
	maxClaimed          int
	// claimedBytes is the payload and headers bytes of those rows, bounded by Config.MaxClaimedBytes.
	claimedBytes atomic.Int64
	slots        chan struct{}
	ownSlots     []chan struct{}
	// rescan is set when rows may have turned due behind where claims start (this relay
	// released or reclaimed rows, wrote an ordered row's outcome without a claim, or a
	// NOTIFY came), so that the next claims start at the head of the index.
	rescan atomic.Bool

	listening atomic.Bool
	// relisten asks the LISTEN connection to be made again, as the pool's are (see
	// takesNoWrites in the claim loop).
	relisten chan struct{}
	skew     atomic.Int64 // database clock minus local clock, when NowFunc is the real clock (see readClock)
	// skewRead says skew has been measured (see readClock). Atomic, as skew is: tests call
	// reclaim, which reads the clock, beside a running relay's own passes.
	skewRead atomic.Bool
	probe    string // the payload of this relay's NOTIFY self-test
	// probeTimeout is how long the NOTIFY self-test waits; tests shorten it.
	probeTimeout time.Duration
	// listenCheck is how long the LISTEN connection may stay silent before it is
	// pinged, and how long the ping may take (see waitForNotification); tests shorten it.
	listenCheck time.Duration
	// parkBehindMin is the fewest rows waiting behind a row in flight that a pass parks
	// behind it (see parkInFlight); tests lower it.
	parkBehindMin int
	// fastGrace is how long the relay polls fast after its mark lapses (fastPollGrace);
	// tests lengthen it.
	fastGrace time.Duration
	// maintainTimeout bounds each piece of the periodic work (see maintainTimeout);
	// tests shorten it.
	maintainTimeout time.Duration
	// retentionEvery is how often retention runs after its first pass
	// (retentionInterval); tests lengthen it.
	retentionEvery time.Duration
	// reclaimAtMost is the longest time between two reclaims, whatever the poll interval
	// (reclaimInterval); tests shorten it.
	reclaimAtMost time.Duration
	// salvageTimeout bounds each write of salvage, roundTimeout when zero (New leaves
	// it so); tests shorten it.
	salvageTimeout time.Duration
	running        atomic.Bool
	// runCalled is set while Run is running or once it has run: a Relay runs once.
	runCalled atomic.Bool
	// stopped is set once Run has returned (cleared when it is called again, after a
	// start that failed): a relay made later on the same Registerer then takes the place
	// of its metrics (see newMetrics).
	stopped atomic.Bool
	// Rows this relay claimed and knows it never sent, still leased to it: unreleased
	// holds rows whose release failed (the database was away), lost the leases of rounds
	// whose reply was lost (they may have committed, see releaseLost). Both are handed
	// back before the claim loop's next round, before reclaim, and while stopping.
	unreleasedMu sync.Mutex
	unreleased   []claimed
	lost         []time.Time
	// releaseLocks holds rows claimed but not started whose hand-back found them locked
	// by another session: handed back once the lock is let go, looked at with backoff
	// (see setAsideRelease), and left alone by reclaim meanwhile.
	releaseLocks lockWaits[claimed]
	// unfenced holds the database sessions of writes whose reply was lost (claim rounds,
	// outcomes), which may still run in the database: each is ended (see fence) before
	// the rows of a lost round are handed back or a lost outcome is written again.
	unfenced      []session
	anyUnreleased atomic.Bool // unreleased or lost is not empty
	// releasingMu is held while they are handed back, and by reclaim while it looks
	// whether any are left, so that this relay never puts back as an abandoned attempt a
	// row it knows it never sent.
	releasingMu sync.Mutex
	// unwritten holds the leases of the attempts this relay ended and whose outcomes it
	// has not written yet: reclaim leaves those rows alone, since their attempts were not
	// abandoned (see noteUnwritten).
	unwrittenMu sync.Mutex
	unwritten   map[rowAttempt]time.Time
	// lastLease is the lease expiry of the claim loop's last round of claims, and
	// roundLease that of the round in progress (zero: it claims nothing). Each round's is
	// later than the one before (but after the clock stepped back a lease or more, see
	// claimAndRecord), so that the rows of a round whose reply was lost can be found and
	// handed back (see releaseLost). Only the claim loop uses them.
	lastLease, roundLease time.Time
	// oldestPending is the age of the oldest pending row by connector label that the last
	// refresh of the row gauges that worked found, as NowFunc read oldestPendingAt (zero
	// before the first); only refreshStats uses them and unknownWarned, under statsMu
	// (maintain calls it, and tests beside a running relay).
	statsMu         sync.Mutex
	oldestPending   map[string]pendingAges
	oldestPendingAt time.Time
	// unknownWarned holds the connectors the last warning about rows for connectors no
	// running relay has named, as NowFunc read unknownWarnedAt (see refreshStats).
	unknownWarned   map[string]bool
	unknownWarnedAt time.Time
	// lastSeen is the seen_until this relay's last renewal of its words in
	// outbox_wake_connectors wrote (invalid before the first, or after one that failed);
	// only maintain uses it (see seen).
	lastSeen pgtype.Timestamptz
	// withdrawn is set once withdraw has begun: the relay has stopped claiming, and seen
	// no longer renews its words.
	withdrawn atomic.Bool
	// runDone is Run's ctx.Done(), so that Ready says the relay is stopping as soon as
	// it is closed.
	runDone atomic.Pointer[<-chan struct{}]
}

type instance struct {
	name      string
	conn      connectors.Connector
	guarantee connectors.Guarantee
	keyWindow time.Duration // 0: the receiver's memory of keys is not limited (or unknown)
	windowAge bool          // maxAge is keyWindow less attemptMax, shorter than Config.MaxAge
	// attemptMax is the longest an attempt may last: the connector's time limit, or the
	// lease when it declares none (an attempt never outlives its lease).
	attemptMax time.Duration
	maxAge     time.Duration
	limit      int           // most deliveries in flight
	ahead      int           // most rows claimed ahead of a free worker
	startBy    time.Duration // a row claimed ahead that waited longer is handed back
	took       atomic.Int64  // recent attempts' average duration, in nanoseconds
	limiter    *rate.Limiter // nil: no rate limit
	window     *sendWindow   // nil: the limiter alone keeps the rate within every second (see sendWindow)
	ownSlot    chan struct{} // the delivery slot kept for the instance (see reserveSlots); nil: none
	unsent     atomic.Int64  // rows of a rate-limited instance claimed, not yet sent nor handed back
	claimed    atomic.Int64  // rows claimed and not finished
	jobs       chan claimed  // claimed rows waiting for one of the instance's workers
	// holds: its ambiguous attempts are held (AmbiguousHold on a forwarded connector; see
	// decide), so it claims no row that no free slot can take (see claimRound); slotted
	// counts its rows holding a slot, for that only.
	holds   bool
	slotted atomic.Int64
	// The latest time a request took its token at, so that none takes one at an
	// earlier time (see takeToken).
	tokenMu sync.Mutex
	tokenAt time.Time
	// Where the instance's claims start in outbox_pending_due (zero: at its head), and
	// when a claim last started at the head; only the claim loop uses them.
	scanFrom   time.Time
	fullScanAt time.Time
	// Whether its next claim starts at the head of the index all the same: a round that
	// claimed from there for the other instances left it out (see claimRound); only the
	// claim loop uses it.
	rescan bool
	// When it last claimed while the room for claimed rows was tight (see claimRound);
	// only the claim loop uses it.
	tightClaimAt time.Time

	// When the last warning about a row handed back was logged, and how many were
	// handed back since (see handBack).
	handBackMu     sync.Mutex
	handBackWarned time.Time
	handBackQuiet  int64

	// The instance's series, looked up once rather than on every delivery.
	outcomes         map[string]prometheus.Counter
	duration         prometheus.Observer
	commitToDelivery prometheus.Observer
}

// outcomeLabels are the attempts-log outcomes a delivery can end with.
var outcomeLabels = []string{statusDelivered, "retry", statusDead, statusHeld}

// observe records one attempt in the instance's metrics.
func (inst *instance) observe(outcome string, took, sinceCreated time.Duration) {
	inst.outcomes[outcome].Inc()
	inst.duration.Observe(took.Seconds())
	if outcome == statusDelivered {
		inst.commitToDelivery.Observe(sinceCreated.Seconds())
	}
}

// claimed is a row this relay holds the lease on.
type claimed struct {
	id        int64
	key       string
	payload   json.RawMessage
	headers   map[string]string
	attempt   int
	ambiguous bool
	createdAt time.Time
	firstAt   time.Time // when the first attempt started
	claimedAt time.Time // the relay's clock at the claim; the lease runs from then
	ordered   bool      // the row has an ordering key
	dueAt     time.Time // its next_attempt_at
	parked    bool      // it was parked behind an earlier row of its key: dueAt is not its own (see committedFor)
	lease     time.Time // its lease expiry, unique to the round that claimed it
	size      int64     // its payload's and headers' bytes, counted in Relay.claimedBytes
	// local is Config.NowFunc's own reading at the claim, uncorrected: how long the row
	// waits is measured on it (Go's monotonic clock, in production), so that neither a
	// step of the local clock nor a new correction (readClock) changes it.
	local time.Time
}

// committedFor is when the row was committed to be delivered, where
// outboxd_commit_to_delivery_seconds starts: its creation, or its NotBefore time when
// that is later. Its first attempt is due at NotBefore (next_attempt_at, which is the
// creation time without one); a later attempt's next_attempt_at is a retry's, and the
// retries count from creation. A parked row's next_attempt_at is not a time of its
// own: the retry of the earlier row of its key it waited for (relay/sql.go, parkSQL),
// or the end of a minute's parking behind one that waits for an operator or is in
// flight (parkWaitingSQL); a parked row made due again (releaseNextSQL, ops' unpark) is
// due from its creation. It counts from creation, as a row that waited for its key
// unparked does (a NotBefore of its own, which had passed when it was parked, is no
// longer known: the histogram shows such a row as late by the time from its creation to
// its NotBefore).
func (c claimed) committedFor() time.Time {
	if c.attempt == 1 && !c.parked && c.dueAt.After(c.createdAt) {
		return c.dueAt
	}
	return c.createdAt
}

// rowAttempt names one attempt of a row.
type rowAttempt struct {
	id      int64
	attempt int
}

// outcome is how one attempt ended, waiting to be recorded.
type outcome struct {
	id        int64
	key       string // its idempotency key, which names it to the rows parked behind it (queuePark)
	attempt   int
	status    string
	nextAt    *time.Time
	lastError *string
	result    []byte
	ambiguous bool
	started   time.Time
	finished  time.Time
	record    string // the attempts-log outcome
	ordered   bool   // the row has an ordering key
	// maybeWritten: a write of this outcome failed in a way that leaves unknown whether
	// it committed (the connection broke), so it is written again with recordAgainSQL.
	maybeWritten bool
	// nextLocked: another session keeps the next row of its ordering key locked, so the
	// outcome is written without letting that row go (queueRelease): withheld until the
	// lock went, the row, whose own lock is free, was put back by another relay's reclaim
	// once its lease ran out, and sent again (see splitLocked).
	nextLocked bool
	// lockedSince is when a write of this outcome was first found waiting for a lock
	// another session holds (zero: never), so that it is said once (see lockWait).
	lockedSince time.Time
}

// New returns a relay over pool for the given connector instances, keyed by instance
// name ("webhook", "webhook:crm"). It does not touch the database until Run.
func New(pool *pgxpool.Pool, cfg *Config, instances map[string]Instance) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("relay: pool is nil")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("relay config: %w", err)
	}
	// Every instance is checked before anything is registered, so a refused New leaves
	// nothing behind.
	for name, in := range instances {
		if !outbox.ValidConnectorName(name) {
			return nil, fmt.Errorf("relay: connector instance %q: the outbox table cannot hold rows for it; use a kind such as webhook, or kind:name, with lowercase letters, digits and '_', at most 100 characters", name)
		}
		if in.Connector == nil {
			return nil, fmt.Errorf("relay: connector instance %q has no Connector", name)
		}
		// Any other value would be read as enforced: ambiguous attempts retried blindly,
		// the hold policy ignored, though nothing says the receiver dedupes.
		switch g := in.Connector.Guarantee(); g {
		case connectors.Enforced, connectors.Reconciled, connectors.Forwarded:
		default:
			return nil, fmt.Errorf("relay: connector instance %q: its Guarantee is %q; it must be %q, %q or %q",
				name, g, connectors.Enforced, connectors.Reconciled, connectors.Forwarded)
		}
		if in.Concurrency < 0 || in.Rate < 0 || math.IsNaN(in.Rate) || math.IsInf(in.Rate, 0) {
			return nil, fmt.Errorf("relay: connector instance %q: Concurrency and Rate must not be negative, and Rate must be finite", name)
		}
		if in.MaxAge < 0 {
			return nil, fmt.Errorf("relay: connector instance %q: MaxAge must not be negative, got %s", name, in.MaxAge)
		}
		if policy := cmp.Or(in.OnAmbiguous, AmbiguousRetry); policy != AmbiguousRetry && policy != AmbiguousHold {
			return nil, fmt.Errorf("relay: connector instance %q: OnAmbiguous must be %q or %q, got %q", name, AmbiguousRetry, AmbiguousHold, in.OnAmbiguous)
		}
	}
	leaseSet := cfg.Lease != 0
	cfg = cfg.withDefaults()
	if !leaseSet {
		// The payment, email and slack connectors' default time limit is the default
		// lease: an attempt that waited for a slot, then took its time limit, would
		// outlive its lease, and another relay could send the row again meanwhile.
		for _, in := range instances {
			cfg.Lease = max(cfg.Lease, connectors.Timeout(in.Connector)+defaultLeaseSpare)
		}
	}
	reserved := reserveSlots(cfg.Concurrency, len(instances))
	// The most slots one instance can hold: the shared ones, and its own. A worker more
	// would only ever wait for its instance's own attempts, on a row claimed meanwhile.
	mostSlots := cfg.Concurrency - reserved + min(reserved, 1)
	r := &Relay{
		pool:      pool,
		cfg:       cfg,
		log:       cfg.Logger.With("component", "relay", "relay_id", cfg.ID),
		instances: make(map[string]*instance, len(instances)),
		wake:      make(chan struct{}, 1),
		relisten:  make(chan struct{}, 1),
		slotFreed: make(chan struct{}, 1),
		slots:     make(chan struct{}, cfg.Concurrency-reserved),
		ownSlots:  make([]chan struct{}, reserved),
		probe:     "probe:" + cfg.ID,

		probeTimeout:    defaultProbeTimeout,
		listenCheck:     listenCheck,
		parkBehindMin:   parkBehindMin,
		fastGrace:       fastPollGrace,
		maintainTimeout: maintainTimeout,
		retentionEvery:  retentionInterval,
		reclaimAtMost:   reclaimInterval,
		unwritten:       map[rowAttempt]time.Time{},
	}
	for i := range r.ownSlots {
		r.ownSlots[i] = make(chan struct{}, 1)
	}
	m, err := newMetrics(cfg.Registerer, holdings{
		claimedBytes: func() float64 { return float64(r.claimedBytes.Load()) },
		claimedRows:  func() float64 { return float64(r.claimedRows.Load()) },
		inFlight:     func() float64 { return float64(r.inFlight()) },
	}, &r.stopped)
	if err != nil {
		return nil, fmt.Errorf("relay metrics: %w", err)
	}
	r.metrics = m
	for name, in := range instances {
		policy := cmp.Or(in.OnAmbiguous, AmbiguousRetry)
		inst := &instance{
			name:             name,
			conn:             in.Connector,
			guarantee:        in.Connector.Guarantee(),
			keyWindow:        connectors.KeyWindow(in.Connector),
			attemptMax:       AttemptMax(in.Connector, cfg.Lease),
			maxAge:           cmp.Or(in.MaxAge, cfg.MaxAge),
			limit:            min(cmp.Or(in.Concurrency, cfg.Concurrency), mostSlots),
			outcomes:         make(map[string]prometheus.Counter, len(outcomeLabels)),
			duration:         m.deliveryDuration.WithLabelValues(name),
			commitToDelivery: m.commitToDelivery.WithLabelValues(name),
		}
		for _, o := range outcomeLabels {
			inst.outcomes[o] = m.deliveries.WithLabelValues(name, o)
		}
		if in.MaxAge == 0 && inst.keyWindow > 0 {
			// Dead before an attempt could reach the receiver after its window (see
			// forgotten), rather than held there.
			if w := max(inst.keyWindow-inst.attemptMax, 0); w < inst.maxAge {
				inst.maxAge, inst.windowAge = w, true
			}
		}
		if policy == AmbiguousHold && inst.guarantee != connectors.Forwarded {
			// The policy is for receivers that do not enforce the key; this one's
			// connector says it does (or reconciles), so the relay retries with the same
			// key as always. Said once at start: taken silently, it read as held rows that
			// never come.
			r.log.Warn("OnAmbiguous hold has no effect on this instance: its connector's guarantee is not forwarded, "+
				"so an ambiguous attempt is retried with the same key (or looked up first)",
				"connector", name, "guarantee", string(inst.guarantee))
		}
		var ahead int
		ahead, inst.startBy = claimAhead(inst.limit, cfg.Lease, connectors.Timeout(in.Connector))
		switch {
		case policy == AmbiguousHold && inst.guarantee == connectors.Forwarded:
			// No rows ahead for held instances: should the relay die, the rows it claimed
			// ahead come back ambiguous when their lease expires, and held ones would each
			// need a person.
			r.hold = append(r.hold, name)
			inst.holds = true
		case in.Rate > 0:
			// Nor for rate-limited instances: the claims are paced, and rows claimed ahead
			// while the workers are busy (a slow answer) would go out together once they
			// are free, faster than the rate. Without rows ahead, a claimed row finds an
			// idle worker at once, and the requests keep the claims' pace.
		default:
			// At most twenty claims' worth: a round brings an instance at most BatchSize
			// rows, so twenty of them cover twenty rounds at any pace the claims keep up
			// with, and more rows ahead would only wait longer (BatchSize is bounded by the
			// workers first, so that no BatchSize overflows the product). The queue (jobs)
			// has room for every row the instance may hold, allocated here for the relay's
			// life: twenty rounds of the deliveries of 10,000 workers made it 50 MB per
			// instance, 993 MiB for twenty instances before a row was claimed: twice the
			// soft memory limit outboxd serve sets, under which the collector then runs
			// as often as it must.
			inst.ahead = min(ahead, aheadRounds*min(cfg.BatchSize, inst.limit))
		}
		inst.jobs = make(chan claimed, inst.limit+inst.ahead)
		if reserved > 0 {
			inst.ownSlot = r.ownSlots[len(r.names)]
		}
		r.maxClaimed += inst.ahead
		if in.Rate > 0 {
			// A burst of a tenth of a second's worth: a second's worth, after a quiet
			// spell, let a receiver see up to twice its rate within one second, which a
			// receiver that enforces its limit answers with 429.
			// Bounded before the conversion: a tenth of a rate beyond an int would come out
			// of it as a burst of one row.
			burst := max(1, int(min(in.Rate/10, math.MaxInt32)))
			inst.limiter = rate.NewLimiter(rate.Limit(in.Rate), burst)
			if burst > 1 {
				// The burst and then the rate would put burst-1 requests more than the
				// rate in the second that begins with the burst (see sendWindow). With a
				// burst of one, requests are 1/rate apart, never more in a second.
				inst.window = &sendWindow{most: int(min(in.Rate, math.MaxInt32))}
			}
		}
		r.instances[name] = inst
		r.names = append(r.names, name)
	}
	slices.Sort(r.names)
	slices.Sort(r.hold)
	for _, name := range r.names {
		r.maxAges = append(r.maxAges, r.instances[name].maxAge.Seconds())
	}
	r.maxClaimed = cfg.Concurrency + min(r.maxClaimed, aheadRounds*cfg.Concurrency)
	// Room for the outcome of every row the relay can hold (and at least four times the
	// concurrency): rows go on finishing while a round is on its way, and a worker that
	// had to wait for room here would sit idle with its row done. Four times the
	// concurrency alone filled up during a round of 35 ms at 15,000 deliveries a second.
	// A round may claim one row per instance beyond maxClaimed (see share).
	r.results = make(chan outcome, max(r.maxClaimed, 4*cfg.Concurrency)+len(r.names))
	return r, nil
}

// Claiming ahead. A claim is a round trip and a commit; when it waits for free workers,
// they idle while it runs, and its batches stay small. So a relay claims up to
// aheadRounds rounds of an instance's deliveries ahead, and a worker that finishes takes
// the next row at once. A row waits only while the instance's workers are busy: the
// rows claimed ahead are cut to what the workers can start within half of startBy at the
// instance's recent pace, and one that still waited longer than startBy is handed back
// instead of sent, so its attempt ends well inside its lease. Only connectors that
// declare their time limit are claimed ahead, and not those whose ambiguous attempts are
// held. Every row, claimed ahead or not, must start within its instance's startBy: it
// may also wait for one of the Config.Concurrency slots, which other instances' slow
// attempts can hold for longer than a lease. Twenty rounds: a round of the claim loop
// takes 25-40 ms on two cores, while the workers, once they have rows, deliver up to
// 24,000 a second, so ten rounds ahead
// (1,408 rows held at the default concurrency) still ran dry before most claims came
// back, and the cores idled. With twenty, claims of up to 1,000 rows and room for every
// outcome in results, the bench's delivery phase kept the CPU 92.5-94.3% busy, against
// 90.3-91.0% before (eight alternating pairs, every pair the same way), and delivered
// 5% more. Ten rounds had delivered 17% more than three.
const (
	aheadRounds = 20
	minStartBy  = 100 * time.Millisecond
	maxStartBy  = 5 * time.Second
)

// claimAhead returns how many rows of an instance with limit workers to claim ahead at
// most, for a lease and an attempt's time limit (0: the connector declares none), and
// how long after its claim a row may still start its attempt: half of what the lease
// leaves beyond the time limit, at most maxStartBy. Rows are claimed ahead only when the
// time limit is known and leaves room to wait. Without that room (or a known limit) the
// wait for a slot is bounded by a quarter of the lease, at most maxStartBy: a bound of a
// few milliseconds would hand back every row whose claim took longer than that to
// come back, and nothing would ever be sent. But a known limit that leaves some of the
// lease caps the wait at half of it all the same: a row that started later could still
// be in flight when its lease runs out, and another relay would send it again meanwhile.
func claimAhead(limit int, lease, timeout time.Duration) (ahead int, startBy time.Duration) {
	spare := lease - timeout
	if timeout <= 0 || spare < 2*minStartBy {
		startBy = min(lease/4, maxStartBy)
		if timeout > 0 && spare > 0 {
			startBy = min(startBy, spare/2)
		}
		return 0, startBy
	}
	return aheadRounds * limit, min(spare/2, maxStartBy)
}

// room is how many more rows the instance may hold claimed: its workers, and the rows
// they can start within half of startBy at the pace of its recent attempts.
func (inst *instance) room() int {
	ahead := inst.ahead
	if took := time.Duration(inst.took.Load()); took > 0 && ahead > 0 {
		ahead = min(ahead, int(int64(inst.limit)*int64(inst.startBy/2)/int64(took)))
	}
	return inst.limit + ahead - int(inst.claimed.Load())
}

// observeTook folds one attempt's duration into the instance's recent average.
func (inst *instance) observeTook(d time.Duration) {
	old := inst.took.Load()
	inst.took.Store(old + (int64(d)-old)/8) // a lost update among racing workers does no harm
}

// ID is the relay's id, as written in leases and the attempts log.
func (r *Relay) ID() string { return r.cfg.ID }

// now is the relay's clock: the configured clock, corrected to the database's clock when
// it is the real one, so rows stamped now() by plain SQL are due at once, and relays
// compare the lease expiries they write to each other on one clock, the database's.
func (r *Relay) now() time.Time {
	return r.corrected(r.cfg.NowFunc())
}

// corrected is the local reading t on the relay's clock (see now).
func (r *Relay) corrected(t time.Time) time.Time {
	return t.Add(time.Duration(r.skew.Load()))
}

// readClock reads the database's clock and, when NowFunc is the real clock, corrects the
// relay's to it. The relay's clock is compared with lease expiries other relays wrote
// (reclaimSQL), so the correction is measured again before every reclaim, every poll
// interval and at least every reclaimInterval: the local clock or the database's may
// step after start (NTP, a VM resumed, an operator) or drift. It is read on a connection already open, in one round trip (the exec mode: no
// prepare first), so that neither a connect nor a wait for a free connection counts in
// the round trip, whose middle is taken as the moment the database read its clock.
//
// The correction is then off by up to half the round trip, which a stalled reply or a
// retransmitted packet can make seconds: enough to take other relays' live leases, or
// to write leases that others see expire while the attempt is still going. So a
// reading whose round trip took longer than maxClockRoundTrip is not taken as the
// correction once there is one: the correction is moved only as far as the reading
// shows it wrong (the database read its clock some time between before and after).
func (r *Relay) readClock(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// As microseconds since the epoch: the exec mode's results are text, and a
	// timestamp's text follows the session's DateStyle, which may not be ISO. The exec
	// mode (an unnamed statement, parsed, bound and run in one round trip), not the
	// simple protocol, which pgx refuses to use unless the session's client_encoding is
	// UTF8: in an installation in a SQL_ASCII or LATIN1 database, which migrate upgrades
	// as it is, no relay could start.
	var micros int64
	before := r.cfg.NowFunc()
	if err := conn.QueryRow(ctx, `SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8`, pgx.QueryExecModeExec).Scan(&micros); err != nil {
		return err
	}
	dbNow := time.UnixMicro(micros)
	if r.cfg.usesRealClock {
		after := r.cfg.NowFunc()
		skew := dbNow.Sub(before.Add(after.Sub(before) / 2))
		if r.skewRead.Load() && after.Sub(before) > maxClockRoundTrip {
			skew = min(max(time.Duration(r.skew.Load()), dbNow.Sub(after)), dbNow.Sub(before))
		}
		r.skew.Store(int64(skew))
		r.skewRead.Store(true)
	}
	return nil
}

// maxClockRoundTrip is the longest round trip of a reading of the database's clock that
// readClock takes as it is: its error, up to half of it, for two relays together (one
// writes a lease, the other reclaims it) stays within the second that serve wants
// between a connector's timeout and OUTBOX_LEASE.
const maxClockRoundTrip = 500 * time.Millisecond

// ResetPool closes the sessions of r's pool, as [pgxpool.Pool.Reset] does (those in use
// when they are released), and makes r's LISTEN connection again, which is made outside
// the pool. The claim loop calls it when a round is refused because the server takes no
// writes (SQLSTATE 25006); so must anything else that shares the pool and resets it for
// that reason (the intent API in outboxd serve). After a failover that left the old
// primary up, the first such reset moves the pool's sessions to the new primary, so that
// r's claims are then never refused, and a LISTEN connection not made again would stay on
// the old server, where no NOTIFY from the new primary reaches it.
func (r *Relay) ResetPool() {
	r.pool.Reset()
	notify(r.relisten)
}

// leaveReadOnly resets the pool (see ResetPool) when err is a refusal to write (SQLSTATE
// 25006). A failover may have left the pool's sessions on a server that takes no writes
// while new ones reach the primary (target_session_attrs=read-write, a DNS name or a
// proxy that moved). Those sessions answer pings, so the pool would keep them until its
// MaxConnLifetime: close them all (those in use when they are released), so that the
// next write opens new ones. The LISTEN connection, which LISTENs there just as well, is
// made again too. Every write of the relay's calls it, the last ones of a relay that
// stops included: retried on the same sessions after the claim loop had returned, the
// outcomes of the attempts in flight were lost once the drain ran out, and the rows sent
// again once their leases expired, as ambiguous attempts.
func (r *Relay) leaveReadOnly(err error) {
	if takesNoWrites(err) {
		r.ResetPool()
	}
}

// Ready reports whether the relay can work: it runs (it has started) and has not been
// asked to stop, the database answers and takes writes, and the LISTEN connection is up.
func (r *Relay) Ready(ctx context.Context) error {
	if !r.running.Load() {
		if r.runCalled.Load() && r.runDone.Load() == nil {
			// Run waits for the database at start (see start), and warns once meanwhile.
			if err := r.pool.Ping(ctx); err != nil {
				return fmt.Errorf("relay is starting: database unreachable: %w", err)
			}
			return errors.New("relay is starting")
		}
		return errors.New("relay is not running")
	}
	if done := r.runDone.Load(); done != nil && isClosed(*done) {
		return errors.New("relay is stopping: it claims no more rows and finishes the attempts in flight")
	}
	// Not a bare ping: a database that answers but takes no writes (a failover left the
	// pool on a hot standby or a demoted primary) fails every claim and every outcome.
	var readOnly bool
	if err := r.pool.QueryRow(ctx, `SELECT current_setting('transaction_read_only')::bool`).Scan(&readOnly); err != nil {
		return fmt.Errorf("database unreachable: %w", err)
	}
	if readOnly {
		return errors.New("the database takes no writes (it is a hot standby, or default_transaction_read_only is on): " +
			"no row is claimed or recorded until it does")
	}
	if !r.listening.Load() {
		return errors.New("LISTEN connection is down (reconnecting)")
	}
	return nil
}

// Run delivers rows until ctx is done. Then it stops claiming, releases at once the
// leases of rows it had claimed and will not start, gives in-flight deliveries until
// Config.ShutdownTimeout to finish, cancels those still running (their attempts are
// recorded as ambiguous, but for those their connector reports as never sent, which are
// handed back uncounted, and those the receiver answered as the cancel struck, decided as
// any other), records every outcome, and returns nil. It returns an error only when it cannot start (and nil when
// ctx ends while it waits for the database at start).
func (r *Relay) Run(ctx context.Context) error {
	if !r.runCalled.CompareAndSwap(false, true) {
		return errors.New("relay: Run called again; a Relay runs once, create another with New")
	}
	r.stopped.Store(false)
	if err := r.start(ctx); err != nil {
		// Nothing was claimed or closed: Run may be called again. Meanwhile a relay made
		// in its place (an application's loop that makes a new one when Run fails) may
		// take its metrics.
		r.stopped.Store(true)
		r.runCalled.Store(false)
		if ctx.Err() != nil {
			// Stopped while it waited for the database: nothing was claimed.
			return nil
		}
		return err
	}
	runDone := ctx.Done()
	r.runDone.Store(&runDone)
	r.running.Store(true)
	defer r.running.Store(false)
	guarantees := make([]string, len(r.names))
	for i, name := range r.names {
		guarantees[i] = name + "=" + string(r.instances[name].guarantee)
	}
	r.log.InfoContext(ctx, "relay started", "connectors", guarantees, "concurrency", r.cfg.Concurrency,
		"batch_size", r.cfg.BatchSize, "lease", r.cfg.Lease.String())

	// deliverCtx outlives ctx by up to the shutdown timeout, so deliveries in flight at a
	// stop may finish; recordCtx outlives it a little more, so their outcomes land.
	deliverCtx, cancelDeliveries := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelDeliveries(nil)
	recordCtx, cancelRecords := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRecords()
	// The shutdown timeout runs from the stop itself, not from when the claim loop has
	// returned: a round stuck in the database (a lock, a hung connection) may hold the
	// loop for up to roundTimeout.
	shutdownTimedOut := make(chan struct{})
	stopShutdownTimer := context.AfterFunc(ctx, func() {
		time.AfterFunc(r.cfg.ShutdownTimeout, func() {
			cancelDeliveries(errors.New("relay shutdown timeout reached"))
			close(shutdownTimedOut)
		})
	})
	defer stopShutdownTimer() // Run may return on an error before any stop

	var background sync.WaitGroup
	bgCtx, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	background.Go(func() { r.listen(bgCtx) })
	background.Go(func() { r.maintain(bgCtx) })

	// Long-lived delivery workers, as many per instance as its limit: a claimed row
	// starts as soon as a worker is free, and a worker's stack, grown by its first
	// request, serves every later one.
	var workers sync.WaitGroup
	for _, inst := range r.instances {
		for range inst.limit {
			workers.Go(func() { r.work(ctx, deliverCtx, inst) })
		}
	}
	left := r.claimLoop(ctx)
	for _, inst := range r.instances {
		close(inst.jobs)
	}
	// The rows still queued will never start: hand them back now, in one statement, not
	// once the deliveries in flight have ended, which may take up to their time limit;
	// meanwhile their leases could run out, and another relay would put them away as
	// lost attempts (ambiguous, held, or dead on their last attempt). Idle workers take
	// some of them too, and hand each back at once.
	var queued []claimed
	for _, inst := range r.instances {
		for row := range inst.jobs {
			queued = append(queued, row)
			r.done(inst, row)
		}
	}
	r.release(context.Background(), queued)
	// From now on the recorder writes the outcomes: those the loop left, and those of
	// the deliveries still in flight.
	var recorder sync.WaitGroup
	recorded := make(chan struct{})
	recorder.Go(func() {
		defer close(recorded)
		r.record(recordCtx, left, r.results)
	})
	// Stopping: let in-flight deliveries finish within the shutdown timeout.
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	// Releases that failed (the database was away) are tried again while the relay is
	// stopping, as outcomes are: a row never sent must not come back as an ambiguous
	// attempt once its lease expires.
	recorder.Go(func() { r.releaseWhileStopping(recordCtx, done) })
	select {
	case <-done:
	case <-shutdownTimedOut: // deliveries still in flight were cancelled
		r.log.WarnContext(ctx, "shutdown timeout reached; cancelling deliveries still in flight",
			"in_flight", r.inFlight(), "timeout", r.cfg.ShutdownTimeout)
		<-done
	}
	close(r.results)
	// The recorder drains every outcome; give it a bounded time when the database is down.
	recDone := make(chan struct{})
	go func() { recorder.Wait(); close(recDone) }()
	select {
	case <-recDone:
	case <-time.After(max(r.cfg.ShutdownTimeout, minRecordDrain)):
		// Only when outcomes are left: the recorder may be done, and only hand-backs of
		// rows another session keeps locked left (see releaseWhileStopping, which says so).
		if !isClosed(recorded) {
			r.log.ErrorContext(ctx, "could not record every outcome before exit; those rows stay leased and are retried after their lease expires")
		}
		cancelRecords()
		<-recDone
	}
	stopBackground()
	background.Wait()
	r.stopped.Store(true)
	r.log.InfoContext(ctx, "relay stopped")
	return nil
}

// releaseWhileStopping retries the releases that failed (see release) until none is
// left once the workers are done (closed done), or ctx ends.
func (r *Relay) releaseWhileStopping(ctx context.Context, done <-chan struct{}) {
	failures := 0
	for ctx.Err() == nil {
		if r.anyUnreleased.Load() || r.releaseLocksDue() {
			r.releaseAgain(ctx)
			if r.anyUnreleased.Load() {
				failures++
				sleep(ctx, backoff(failures, 100*time.Millisecond, 5*time.Second))
				continue
			}
			failures = 0
		}
		select {
		case <-ctx.Done():
		case <-done:
			// A hand-back under way elsewhere (reclaim's releaseAgain, which runs on
			// until the recorder is done) has taken its rows off the lists: waited for,
			// under releasingMu, so that the rows it fails to hand back are retried here
			// rather than left to their lease once Run stops the background work.
			if !r.waitReleasing(ctx) {
				continue // ctx ended
			}
			if r.anyUnreleased.Load() {
				continue // retried at the top of the loop
			}
			// Rows another session keeps locked are looked at again with their own
			// backoff (see retryLockedReleases), until the lock is let go or ctx ends.
			wait := r.releaseLockWait(time.Now())
			if wait == 0 {
				return // no worker hands a row back any more
			}
			sleep(ctx, wait)
		case <-time.After(50 * time.Millisecond): // a worker may still hand one back
		}
	}
	if n := len(r.leftLocked()); n > 0 {
		r.log.WarnContext(context.WithoutCancel(ctx), "stopped while another database session kept locked rows this relay claimed but did not start: "+
			"they stay leased to it until their lease expires, and a relay's reclaim then puts them back as attempts that may have happened (ambiguous)",
			"rows", n)
	}
}

// waitReleasing waits until no hand-back runs under releasingMu (see releaseAgain), or
// ctx ends; it reports whether it got there.
func (r *Relay) waitReleasing(ctx context.Context) bool {
	for !r.releasingMu.TryLock() {
		if ctx.Err() != nil {
			return false
		}
		sleep(ctx, 10*time.Millisecond)
	}
	r.releasingMu.Unlock()
	return true
}

// leftLocked returns the rows set aside because another session kept them locked (see
// setAsideRelease), not handed back yet.
func (r *Relay) leftLocked() []claimed {
	r.unreleasedMu.Lock()
	defer r.unreleasedMu.Unlock()
	return slices.Clone(r.releaseLocks.outs)
}

// minRecordDrain is the least time a stopping relay gives its last outcomes to reach a
// slow database: an outcome not recorded means a second attempt after the lease expires.
const minRecordDrain = 5 * time.Second

// start pings the database (the pool connects lazily), retrying briefly so that a relay
// started alongside its database waits for it, measures clock skew, and checks the
// server's version, that it takes writes, the session's DateStyle (in the query exec
// modes whose results are text), the schema's version and the role's privileges. The
// reads are retried together: PostgreSQL restarting just after the first answered breaks
// the connection the others run on.
func (r *Relay) start(ctx context.Context) error {
	var (
		server, version                 int
		readOnly                        bool
		isolation                       string
		role, missing, missingRetention string
		dateStyle                       string
	)
	b := retry.WithMaxDuration(30*time.Second, retry.WithCappedDuration(2*time.Second, retry.NewExponential(100*time.Millisecond)))
	// Said once, at the first failure: the start said nothing while it retried, so a
	// wrong password or host, or a database not up yet, showed no line for 30 seconds
	// before the relay gave up.
	var warned bool
	stop := ctx
	err := retry.Do(ctx, b, func(ctx context.Context) error {
		// Each try bounded: ctx has no time limit, and a connection that hung (no answer
		// and no reset: a partition, a firewall that forgot it) held the start, the relay
		// neither running nor failing, for as long as the kernel retransmitted, or for
		// good. Cut short, the try is retried on another connection.
		ctx, cancel := context.WithTimeout(ctx, startTryTimeout)
		defer cancel()
		if err := r.readClock(ctx); err != nil {
			if !warned && stop.Err() == nil {
				warned = true
				r.log.WarnContext(ctx, "cannot reach the database at start; trying again for up to 30 seconds", "err", err)
			}
			return retry.RetryableError(fmt.Errorf("reach database: %w", err))
		}
		// transaction_read_only is on in every session of a hot standby, as of a primary
		// set default_transaction_read_only; transaction_isolation is, outside a
		// transaction block, the session's default_transaction_isolation.
		if err := r.pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('transaction_read_only')::bool,
		       current_setting('DateStyle'), current_setting('transaction_isolation')`).Scan(&server, &readOnly, &dateStyle, &isolation); err != nil {
			return retryUnlessRefused(fmt.Errorf("read the server's version: %w", err))
		}
		var err error
		if version, err = outboxd.AppliedVersion(ctx, r.pool); err != nil {
			return retryUnlessRefused(err)
		}
		if version < outboxd.SchemaVersion {
			return nil // refused below; the tables asked about may not be there
		}
		if err := r.pool.QueryRow(ctx, missingPrivilegesSQL).Scan(&role, &missing, &missingRetention); err != nil {
			return retryUnlessRefused(fmt.Errorf("read the role's privileges: %w", err))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	// A database the relay cannot work with is refused now, rather than retried in
	// every round while readiness says all is well. A newer schema is accepted: its
	// changes are additive, and relays are upgraded one at a time.
	if err := checkServerVersion(server); err != nil {
		return err
	}
	// Every claim and every outcome would fail (SQLSTATE 25006) for as long as it runs.
	if readOnly {
		return errors.New("relay: the database takes no writes (it is a hot standby, or default_transaction_read_only is on): " +
			"point the relay at the primary, with target_session_attrs=read-write in the URL if it lists several hosts")
	}
	// In these modes pgx reads every result as text, and a timestamp's text follows the
	// session's DateStyle, which pgx reads only in the ISO style: with another, every round
	// failed to read what it claimed (the session each write is tied to, the rows' times),
	// and the relay delivered nothing while Ready said all was well. The other modes read
	// timestamps in binary, whatever the DateStyle.
	if mode := r.pool.Config().ConnConfig.DefaultQueryExecMode; (mode == pgx.QueryExecModeSimpleProtocol || mode == pgx.QueryExecModeExec) &&
		!strings.HasPrefix(dateStyle, "ISO") {
		return fmt.Errorf("relay: the session's DateStyle is %q, and in pgx's %s query exec mode timestamps are read only in the ISO style: "+
			"add datestyle=ISO to the database URL, or set DateStyle to ISO for the relay's role", dateStyle, mode)
	}
	// The relay's transactions count on each statement taking a snapshot of its own: a
	// claim round's claims one taken once it holds the replay lock (internal/replaylock),
	// and their row locks the newest version of a row another relay changed meanwhile.
	// REPEATABLE READ and SERIALIZABLE take one snapshot at a transaction's first
	// statement: a round that waited for a replay of a dead head of an ordering key read
	// it as still dead and claimed the key's next row, which then went out beside the
	// head, and claims fail (SQLSTATE 40001) on rows other relays changed. PostgreSQL
	// runs READ UNCOMMITTED as READ COMMITTED.
	if isolation != "read committed" && isolation != "read uncommitted" {
		return fmt.Errorf("relay: the database's sessions run at isolation level %s by default (default_transaction_isolation), "+
			"and the relay needs read committed: add default_transaction_isolation=read%%20committed to the relay's database URL "+
			"(a setting sent at connect, which outranks ALTER DATABASE and ALTER ROLE); a relay inside an application whose own work "+
			"needs %s takes a pool of its own", isolation, isolation)
	}
	if version < outboxd.SchemaVersion {
		return fmt.Errorf("relay: the database's outbox schema is at version %d and this relay needs version %d: "+
			"run outboxd migrate (or outboxd.Migrate) first", version, outboxd.SchemaVersion)
	}
	// A role that may not work the rows would otherwise start, and fail every claim
	// and every reclaim, each with a warning, for as long as it runs.
	if missing != "" {
		return fmt.Errorf("relay: role %s lacks privileges the relay needs: %s", role, missing)
	}
	if missingRetention != "" {
		// It delivers all the same, as it did before this check: refusing to start would
		// stop, at an upgrade, a relay that worked.
		r.log.ErrorContext(ctx, "this relay's role may not delete delivered and canceled rows past OUTBOX_RETENTION, "+
			"which are kept until it may: grant "+missingRetention+" to role "+role)
	}
	return nil
}

// startTryTimeout bounds each try of start's reads.
const startTryTimeout = 10 * time.Second

// retryUnlessRefused marks err to be retried at start unless the database answered it
// with a refusal waiting will not change (permission denied, say): those fail Run at
// once. Lost connections, and a server shutting down, starting or out of connections
// (SQLSTATE classes 08, 57 and 53), are retried.
func retryUnlessRefused(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) >= 2 { // else not a SQLSTATE: retried
		switch pgErr.Code[:2] {
		case "08", "53", "57":
		default:
			return err
		}
	}
	return retry.RetryableError(err)
}

// minServerVersion is the oldest PostgreSQL the relay works with, as server_version_num:
// its claim asks pg_column_compression (PostgreSQL 14) how a payload is stored.
const minServerVersion = 140000

// checkServerVersion refuses a server older than minServerVersion (server is its
// server_version_num).
func checkServerVersion(server int) error {
	if server >= minServerVersion {
		return nil
	}
	version := fmt.Sprintf("%d.%d", server/10000, server%10000)
	if server < 100000 { // before PostgreSQL 10, three parts: 90624 is 9.6.24
		version = fmt.Sprintf("%d.%d.%d", server/10000, server/100%100, server%100)
	}
	return fmt.Errorf("relay: the database runs PostgreSQL %s, and the relay needs PostgreSQL %d or later",
		version, minServerVersion/10000)
}

// Fast polling. A relay that claimed rows within the last fastPollWindow looks for more
// every fastPollInterval, and says so in outbox_wake_connectors for each of its connector
// instances; while relays poll fast for every instance a running relay has, the insert
// trigger sends no NOTIFY. PostgreSQL serialises the commits of all transactions that NOTIFY,
// so under steady load the notifications would cap the application's commit rate; when
// the load stops, polling_until lapses and inserts wake idle relays with NOTIFY again.
//
// The trigger decides when a row is inserted, and the notification goes out at COMMIT:
// a transaction that inserted while the mark stood and commits after it lapsed sends
// none. So the relay goes on polling fast for fastPollGrace after the mark it wrote
// lapses, and finds such a row at once rather than at its PollInterval; a transaction
// that takes longer than that from its insert to its COMMIT still waits for the poll.
const (
	fastPollInterval = 2 * time.Millisecond
	fastPollWindow   = 2 * time.Second
	fastPollRefresh  = fastPollWindow / 4
	fastPollGrace    = time.Second
)

// withdraw takes back, once the claim loop has stopped, this relay's words in
// outbox_wake_connectors that it has its instances and polls fast for them: otherwise
// inserts would send no NOTIFY until the fast-polling mark lapsed, and a relay still
// running but idle would find their rows only at its PollInterval; and while the word
// that it has them lasted (seenFor), inserts would wake relays with NOTIFY they do not
// need (the commits of transactions that notify are serialised). It wakes the relays
// still running too, for the rows inserted while its mark stood that it did not claim
// (see withdrawSQL). It is best effort,
// bounded by withdrawTimeout: a relay that cannot reach the database (or was killed)
// leaves its words to lapse by themselves.
//
// Set before the words are deleted, withdrawn stops seen renewing them: a renewal
// still running in the database when the relay was asked to stop (maintain's context
// ends with Run's, but a statement may commit after its cancel) would bring back the
// words this withdrew, for a minute.
func (r *Relay) withdraw(ctx context.Context) {
	r.withdrawn.Store(true)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	if _, err := r.pool.Exec(ctx, withdrawSQL, r.cfg.ID); err != nil {
		r.log.WarnContext(ctx, "could not withdraw the fast-polling mark; inserts wake other relays again once it lapses",
			"err", err, "within", fastPollWindow)
	}
}

// withdrawTimeout bounds withdraw.
const withdrawTimeout = 2 * time.Second

// pollFastTimeout bounds the claim loop's statement that says it polls fast (pollFastSQL):
// a hint for the insert trigger, which a statement cut short leaves unknown, and the loop
// then polls fast as though it had been written.
const pollFastTimeout = 2 * time.Second

// claimLoop claims rows for the delivery workers and records their outcomes until ctx
// is done, in rounds. A round writes the outcomes gathered since the last one and claims
// for every instance with room, in one round trip and one transaction (a pgx batch): one
// connection doing both in turn costs PostgreSQL far less than claims and records
// competing in separate transactions, and half the commits. Outcomes wait up to
// recordLinger for a round, which a claim brings sooner under load. It returns the
// outcomes it has not written.
func (r *Relay) claimLoop(ctx context.Context) []outcome {
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	linger := time.NewTimer(recordLinger)
	linger.Stop()
	var (
		failures    int
		fastUntil   time.Time // this relay polls fast until then (monotonic clock)
		lastRefresh time.Time
		outs        []outcome          // outcomes not written yet
		locked      lockWaits[outcome] // outcomes set aside, whose writes wait for other sessions' locks
		urgent      bool               // one of outs is of a row with an ordering key
		lingering   bool               // linger runs for the oldest of outs
		lingered    bool               // and has fired
	)
	defer r.withdraw(ctx)
	for ctx.Err() == nil {
		if r.anyUnreleased.Load() || r.releaseLocksDue() {
			r.releaseAgain(ctx)
		}
		outs, urgent = r.gather(outs, urgent)
		if free := r.retryLocked(ctx, &locked); len(free) > 0 {
			outs = append(outs, free...)
			urgent = urgent || anyOrdered(free)
		}
		if len(outs) > 0 && !lingering {
			linger.Reset(recordLinger)
			lingering = true
		}
		select { // rounds that follow each other do not wait below, so look here too
		case <-linger.C:
			lingered = true
		default:
		}
		record := len(outs) > 0 && (urgent || lingered || len(outs) >= recordBatch)
		claimed, wrote, more, retryIn, err := r.claimRound(ctx, outs, record)
		if oe := (*outcomesError)(nil); errors.As(err, &oe) && refused(err) {
			// Not the database's fault: write the batch in parts instead, and go on.
			r.log.WarnContext(ctx, "the database refused a batch of outcomes; writing it in parts", "err", err, "outcomes", len(outs))
			outs = r.salvage(ctx, outs, err)
			urgent = urgent && len(outs) > 0
			continue
		}
		if oe := (*outcomesError)(nil); errors.As(err, &oe) && lockTimedOut(err) {
			// Another session holds a lock one of the outcomes waits for: write the others
			// apart from the claims, and set aside those that wait, to be tried again
			// later; the claims go on in the next rounds.
			var blocked []outcome
			outs, blocked, err = r.writeAround(ctx, outs)
			locked.add(blocked)
			urgent = anyOrdered(outs)
			if err == nil {
				continue
			}
			if refused(err) {
				// A part of them the database refused for its data, as above.
				outs = r.salvage(ctx, outs, err)
				urgent = anyOrdered(outs)
				continue
			}
		}
		if ce := (*claimError)(nil); errors.As(err, &ce) && refused(err) && !unsure(err) {
			// A row the claim cannot take for its data, which plain SQL wrote: the claim
			// fails at it every round, and took the round's outcomes with it. Write them
			// apart, and send the rows at fault to dead; the claims go on in the next round.
			if len(outs) > 0 {
				switch err := r.writeApart(ctx, outs); {
				case err == nil:
					outs, urgent, lingering, lingered = outs[:0], false, false, false
					linger.Stop()
				case refused(err):
					outs = r.salvage(ctx, outs, err)
					urgent = anyOrdered(outs)
				}
			}
			if r.buryUnclaimable(ctx, ce) > 0 {
				r.metrics.dbErrors.WithLabelValues("claim").Inc() // it failed all the same
				continue
			}
		}
		if err != nil {
			// The round may have committed without its reply reaching us: its outcomes are
			// written again, but logged once, and the rows it claimed, which no worker
			// will ever see, are handed back as soon as the database answers.
			if unsure(err) {
				markMaybeWritten(outs)
				r.roundLost()
			}
			if ctx.Err() != nil {
				return append(outs, locked.outs...)
			}
			r.leaveReadOnly(err)
			failures++
			wait := backoff(failures, 100*time.Millisecond, 5*time.Second)
			r.failed(ctx, "claim", claimFailed, err, "retry_in", wait, "outcomes", len(outs))
			sleep(ctx, wait)
			continue
		}
		if failures > 0 {
			r.recovered(ctx, claimFailed)
		}
		failures = 0
		if wrote {
			r.written(outs)
			outs, urgent, lingering, lingered = outs[:0], false, false, false
			linger.Stop()
		}
		if claimed > 0 && time.Since(lastRefresh) >= fastPollRefresh {
			// Bounded, as a round is: the loop writes no outcome and claims no row while it
			// waits, and a connection that hangs (a network that drops packets without a
			// reset) would hold it for as long as the kernel retransmits, minutes, while
			// the leases of the rows it sent run out.
			pollCtx, cancel := context.WithTimeout(ctx, pollFastTimeout)
			_, err := r.pool.Exec(pollCtx, pollFastSQL, r.cfg.ID, nonNil(r.names), fastPollWindow)
			cancel()
			if err == nil {
				lastRefresh = time.Now()
			}
			// A statement whose reply was lost may have committed: inserts then send no
			// NOTIFY for the next fastPollWindow, so this relay polls fast as it says, and
			// for fastGrace after, for the transactions that inserted before the mark
			// lapsed and commit after (see fastPollGrace). In the simple protocol (as
			// behind a transaction pooler) pgx reports that lost reply as "conn closed",
			// which it calls safe to retry, and unsure as never sent: sent or not, polling
			// fast does no harm.
			if err == nil || unsure(err) || errors.Is(err, pgconn.ErrConnClosed) {
				fastUntil = time.Now().Add(fastPollWindow + r.fastGrace)
			}
		}
		if more {
			continue
		}
		if time.Now().Before(fastUntil) && (retryIn == 0 || retryIn > fastPollInterval) {
			retryIn = fastPollInterval
		}
		for _, wait := range []time.Duration{locked.wait(time.Now()), r.releaseLockWait(time.Now())} {
			if wait > 0 && (retryIn == 0 || wait < retryIn) {
				retryIn = wait
			}
		}
		var (
			timer   *time.Timer
			timerCh <-chan time.Time
		)
		if retryIn > 0 {
			timer = time.NewTimer(retryIn)
			timerCh = timer.C
		}
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-r.slotFreed:
		case <-poll.C:
			// Every poll tick looks from the head of the index. The time since the last
			// full scan alone (scanStart) can come out just short of a poll interval at a
			// tick, which would leave a row behind where claims start (one whose NOTIFY
			// was lost) for a second interval.
			r.rescan.Store(true)
		case <-timerCh:
		case o := <-r.results:
			outs = append(outs, o)
			urgent = urgent || o.ordered
		case <-linger.C:
			lingered = true
		}
		if timer != nil {
			timer.Stop()
		}
	}
	return append(outs, locked.outs...)
}

// gather adds the outcomes waiting in r.results to outs, up to recordBatch, without
// blocking.
func (r *Relay) gather(outs []outcome, urgent bool) ([]outcome, bool) {
	for len(outs) < recordBatch {
		select {
		case o, ok := <-r.results:
			if !ok { // closed: the relay is stopping and every outcome is in
				return outs, urgent
			}
			outs = append(outs, o)
			urgent = urgent || o.ordered
		default:
			return outs, urgent
		}
	}
	return outs, urgent
}

// roundTimeout bounds one round of claims and outcomes.
const roundTimeout = 30 * time.Second

// claimPlan is how many rows one claim asks of an instance.
type claimPlan struct {
	inst  *instance
	limit int
	bytes int64     // most payload bytes (see claimSQL)
	from  time.Time // where the scan starts (zero: at the head of the index)
}

// claimRound claims for every instance as much as its room and rate allow, in one
// transaction that also writes outs when record is true, or when there are claims to
// make and at least recordWithClaim outs, and returns how many rows it claimed and
// whether it wrote outs. more is true when some claim came back full (there may be
// more due rows); retryIn is when a rate-limited instance will next have a token, or an
// instance left out while the room is tight may claim again.
func (r *Relay) claimRound(ctx context.Context, outs []outcome, record bool) (claimed int, wrote, more bool, retryIn time.Duration, err error) {
	r.roundLease = time.Time{}
	var plans []claimPlan
	room := r.maxClaimed - int(r.claimedRows.Load())
	// The payload bytes left to claim (see Config.MaxClaimedBytes). With less than a
	// quarter left, only instances that hold no rows claim, so that one instance's large
	// payloads never stop the others; a claim takes at least one row, however large.
	bytesLeft := r.cfg.MaxClaimedBytes - r.claimedBytes.Load()
	bytesTight := bytesLeft < r.cfg.MaxClaimedBytes/4
	// Under load, wait for a quarter of the room before claiming, so claims stay batches.
	// An instance that holds no rows claims all the same, every tightClaimEvery at most:
	// the rows of another, claimed ahead of a receiver that hangs (before its attempts'
	// pace is known), can keep the room below a quarter until they are handed back, and
	// its rows would wait as long. It does so with no room left too (a row, see share):
	// two such instances can take all of it in a round the others sat out (waiting for a
	// token, say).
	roomTight := room < max(1, r.maxClaimed/4)
	for _, name := range r.names {
		inst := r.instances[name]
		if (bytesTight || roomTight) && inst.claimed.Load() > 0 {
			continue
		}
		if roomTight {
			now := time.Now()
			if wait := tightClaimEvery - now.Sub(inst.tightClaimAt); wait > 0 {
				// Looked at again then: what woke this round (a NOTIFY for its rows)
				// may be the last wake-up before the next poll.
				if retryIn == 0 || wait < retryIn {
					retryIn = wait
				}
				continue
			}
			inst.tightClaimAt = now
		}
		limit := min(r.cfg.BatchSize, max(room, 1), inst.room())
		if inst.holds {
			// No more rows waiting for a slot than the slots free now, or one, which keeps
			// its place in the queue for the next slot to come free: other instances'
			// attempts can hold every shared slot for long, and the rows claimed meanwhile
			// would wait under a lease (up to startBy, and be claimed again after each
			// hand-back). Should the relay die, each would come back held for an operator,
			// though never sent. A slot that comes free wakes the loop.
			free := cap(r.slots) - len(r.slots)
			if inst.ownSlot != nil && len(inst.ownSlot) == 0 {
				free++
			}
			limit = min(limit, max(free, 1)-int(inst.claimed.Load()-inst.slotted.Load()))
		}
		if inst.limiter != nil {
			// A row takes its token as its request goes (see deliver): the tokens of
			// rows claimed and not yet sent are spoken for. Read in this order, the
			// opposite of deliver's (token taken, then unsent lowered), a row going
			// meanwhile is never left out of both, which would claim one row too many;
			// at worst it is counted in both, and the claim takes one row too few.
			// On the uncorrected reading, as deliver takes the tokens: the correction to
			// the database's clock moves (see readClock), and the limiter would count a
			// step of it as time gone by.
			local := r.cfg.NowFunc()
			unsent := float64(inst.unsent.Load())
			free := inst.limiter.TokensAt(local) - unsent
			tokens := int(free)
			if free < 1 {
				// At most maxRateWait: the next token of a tiny rate can be further off
				// than a time.Duration reaches, and the conversion then came out negative,
				// raised below to a millisecond, so the loop turned every millisecond.
				// The poll looks again sooner anyway.
				secs := min((1-free)/float64(inst.limiter.Limit()), maxRateWait.Seconds())
				wait := time.Duration(secs * float64(time.Second))
				if retryIn == 0 || wait < retryIn {
					retryIn = max(wait, time.Millisecond)
				}
				continue
			}
			limit = min(limit, tokens)
			if inst.window != nil {
				// Read after the tokens, as deliver notes a request in the window before
				// it lowers unsent: at worst a request is counted twice here too.
				n, wait := inst.window.free(local, int(unsent))
				if n < 1 {
					if wait > 0 && (retryIn == 0 || wait < retryIn) {
						retryIn = max(wait, time.Millisecond)
					}
					continue
				}
				limit = min(limit, n)
			}
		}
		if limit > 0 {
			plans = append(plans, claimPlan{inst: inst, limit: limit})
		}
	}
	share(plans, room)
	plans = slices.DeleteFunc(plans, func(p claimPlan) bool { return p.limit <= 0 })
	if len(plans) == 0 && !record {
		return 0, false, false, retryIn, nil
	}
	// Where each claim starts: at the head of the index when rows may have gone back to
	// pending behind where it would start (this relay released rows, or writes the
	// outcome of a row with an ordering key, whose next row becomes due now), and now and
	// then anyway; else where the instance's last claim found rows (see scanStart).
	rescan := len(plans) > 0 && r.rescan.Swap(false)
	unblocks := anyOrdered(outs)
	for i := range plans {
		plans[i].from = plans[i].inst.scanStart(time.Now(), rescan || unblocks || plans[i].inst.rescan, r.cfg.PollInterval)
		plans[i].bytes = max(1, bytesLeft/int64(len(plans))) // the bytes left, shared evenly
	}
	if !record && len(outs) < recordWithClaim {
		outs = nil // they linger (see recordWithClaim)
	}
	// A stop does not interrupt a round in flight: its outcome (written or not) would
	// be unknown, and the recorder would write the outcomes twice.
	roundCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), roundTimeout)
	got, err := r.claimAndRecord(roundCtx, plans, outs)
	cancel()
	if err != nil {
		if rescan {
			r.rescan.Store(true)
		}
		return 0, false, false, 0, err
	}
	wrote = len(outs) > 0
	// The instances this round left out (they hold rows while the room is tight, or wait
	// for a token) start their next claim at the head too: the rows it looked there for
	// may be theirs.
	if rescan || (wrote && unblocks) {
		for _, inst := range r.instances {
			inst.rescan = true
		}
	}
	for _, p := range plans {
		p.inst.rescan = false
	}
	if wrote && len(plans) == 0 && unblocks {
		// No claim rode with the outcome of a row with an ordering key: the next one
		// starts at the head of the index, where the key's next row may lie.
		r.rescan.Store(true)
	}
	if ctx.Err() != nil {
		// Stopping between the claim and the start: hand the rows back.
		r.release(context.Background(), slices.Concat(got...))
		return 0, wrote, false, 0, nil
	}
	for i, p := range plans {
		rows := got[i]
		claimed += len(rows)
		if p.inst.limiter != nil {
			p.inst.unsent.Add(int64(len(rows)))
		}
		r.metrics.claimBatch.Observe(float64(len(rows)))
		p.inst.scanFound(rows)
		// Never blocks: an instance's claimed rows never exceed its channel's capacity.
		r.claimedRows.Add(int64(len(rows)))
		p.inst.claimed.Add(int64(len(rows)))
		for _, row := range rows {
			r.claimedBytes.Add(row.size)
			if row.ordered {
				r.claimedOrdered.Add(1)
				r.orderedClaims.Add(1)
			}
			p.inst.jobs <- row
		}
		if len(rows) == p.limit {
			more = true
		}
	}
	return claimed, wrote, more, retryIn, nil
}

// sendWindow keeps the requests of a rate-limited instance within any one second to its
// rate, which its limiter alone does not once its burst is more than one: the burst
// goes at once and the tokens then come at the rate, so the second that begins with the
// burst (at start, or after a quiet spell) saw the rate and burst-1 more, 109 requests
// at 100/s, and a receiver that counts its limit over a second answered the last with
// 429. It holds the times of the requests of the last second, never more than most of
// them, on the uncorrected clock the limiter reads.
type sendWindow struct {
	most  int // the most requests within one second: the rate, rounded down
	mu    sync.Mutex
	times []time.Time // oldest first
}

// free returns how many more requests may go at now besides the unsent ones already
// claimed, and, when none may, how long until one may.
func (w *sendWindow) free(now time.Time, unsent int) (n int, wait time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forget(now)
	n = w.most - len(w.times) - unsent
	if n > 0 || unsent >= w.most {
		return n, 0 // when the unsent rows go, their workers wake the claim loop
	}
	// One more may go once all but the last most-unsent-1 have left the second.
	return n, w.times[len(w.times)-w.most+unsent].Add(time.Second).Sub(now)
}

// sent notes a request that goes at t.
func (w *sendWindow) sent(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forget(t)
	w.times = append(w.times, t)
}

// forget drops the requests that went a second or more before now.
func (w *sendWindow) forget(now time.Time) {
	i := 0
	for i < len(w.times) && now.Sub(w.times[i]) >= time.Second {
		i++
	}
	w.times = w.times[i:]
}

// tightClaimEvery is the least time between two claims of an instance that holds no
// rows while the room for claimed rows is below a quarter: the claim loop turns on every
// attempt that ends, and the others' attempts end all the time under load.
const tightClaimEvery = 10 * time.Millisecond

// maxRateWait bounds how long claimRound says to wait for a rate-limited instance's
// next token.
const maxRateWait = time.Hour

// Where claims start. The entries of outbox_pending_due for rows already claimed stay in
// the index, dead, until VACUUM removes them, and autovacuum comes seldom to a table that
// keeps its delivered rows: a claim that started at the index's head would walk more of
// them with every row delivered (a million take it from a tenth of a millisecond to
// five). So an instance's claim starts scanMargin before the earliest row its last claim
// took. A row can turn pending behind that point: its transaction ran longer than
// scanMargin, a relay released it, an operator approved or replayed it, or it waited for
// an earlier row of its ordering key. The claims start at the head of the index after
// this relay releases rows, after a NOTIFY (approvals, replays, cancels and rejections
// send one), after reclaiming rows, in a round that writes the outcome of a row with an
// ordering key (or the next round, when that one claimed nothing), and at least once
// every poll interval.
const scanMargin = 5 * time.Second

// scanStart returns where the instance's next claim starts (zero: at the index's head),
// at the head when full is true or when the last claim from the head was a poll
// interval ago or more.
func (inst *instance) scanStart(now time.Time, full bool, every time.Duration) time.Time {
	if full || inst.scanFrom.IsZero() || now.Sub(inst.fullScanAt) >= every {
		inst.fullScanAt = now
		return time.Time{}
	}
	return inst.scanFrom
}

// scanFound moves where the instance's claims start to scanMargin before the earliest
// row of rows, the rows a claim took; to the head when one was due since -infinity.
func (inst *instance) scanFound(rows []claimed) {
	if len(rows) == 0 {
		return
	}
	first := rows[0].dueAt
	for _, row := range rows {
		if row.dueAt.IsZero() {
			inst.scanFrom = time.Time{}
			return
		}
		if row.dueAt.Before(first) {
			first = row.dueAt
		}
	}
	inst.scanFrom = first.Add(-scanMargin)
	if inst.scanFrom.Before(outbox.MinTimestamp) {
		// PostgreSQL cannot hold it (a NotBefore near its earliest time): every claim
		// from there failed with "timestamp out of range". The head is as good.
		inst.scanFrom = time.Time{}
	}
}

// share cuts the plans' limits so that together they ask for at most room rows: each
// instance gets an equal share, and what one does not need goes to the others. Every
// plan keeps at least one row, so with fewer rows of room than instances they ask for
// one each, one more than room allows at most per instance: an equal share of less
// than a row, rounded down, cut the same instances (the first by name) to nothing in
// every round, and their rows were never claimed.
func share(plans []claimPlan, room int) {
	order := make([]int, len(plans))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(plans[a].limit, plans[b].limit) })
	for n, i := range order {
		plans[i].limit = min(plans[i].limit, max(1, room/(len(order)-n)))
		room -= plans[i].limit
	}
}

// claimAndRecord writes outs and runs claimSQL for each plan in one transaction and one
// round trip, and returns each plan's rows. The rows are returned only once the
// transaction has committed: a row is never sent on a claim that did not.
func (r *Relay) claimAndRecord(ctx context.Context, plans []claimPlan, outs []outcome) ([][]claimed, error) {
	local := r.cfg.NowFunc()
	now := r.corrected(local)
	b := &pgx.Batch{}
	if len(plans) > 0 {
		// First, holding no row yet: a replay of a row with an ordering key waits for
		// this round, and the round for a replay under way, before its claims take their
		// snapshots (see internal/replaylock). A round that waited here holding the row
		// locks of its outcomes could deadlock with the replay, which then writes rows.
		// It comes before the outcomes' short lock wait (recordLockWaitGate), on purpose:
		// waiting for a replay is by design (the replay itself gives up after five seconds,
		// see replaylock.ReplayLimitsSQL), and cut short after recordLockWait it failed
		// every round for as long as the replay ran, a warning each, and wrote nothing.
		b.Queue(replaylock.ClaimSQL)
	}
	records := 0
	if len(outs) > 0 {
		records = queueRecord(b, outs, r.recordArgs(outs), r.ownInstances())
	}
	if len(plans) > 0 {
		// The round's lease expiry, as PostgreSQL stores it (microseconds), and later
		// than the last round's: it tells this round's rows from all others of the relay.
		// Only while the last round's is less than a lease ahead: after the clock stepped
		// back further (it ran ahead, and was corrected), every round would otherwise be
		// leased until just past the last round's, for as long as the step, and a relay
		// that died meanwhile left its rows stuck in delivering that long. A round a
		// lease or more ago ended its attempts inside its lease, so its rows are no
		// longer in flight for this round's lease to be taken for theirs.
		lease := now.Add(r.cfg.Lease).Truncate(time.Microsecond)
		if !lease.After(r.lastLease) && r.lastLease.Sub(lease) < r.cfg.Lease {
			lease = r.lastLease.Add(time.Microsecond)
		}
		r.lastLease, r.roundLease = lease, lease
	}
	for _, p := range plans {
		b.Queue(claimSQL, p.inst.name, now, p.limit, r.cfg.ID, r.roundLease, p.start(), p.bytes)
	}
	got := make([][]claimed, len(plans))
	err := r.sendWrite(ctx, outs, b, func(br pgx.BatchResults) error {
		if len(plans) > 0 {
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return fmt.Errorf("claim: lock out replays of rows with ordering keys: %w", err)
			}
		}
		for range records {
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return &outcomesError{fmt.Errorf("record %d outcomes: %w", len(outs), err)}
			}
		}
		for i, p := range plans {
			rows, err := br.Query()
			if err == nil {
				// Not sized for the limit: an idle relay polling every few milliseconds
				// claims a row or none, and zeroing room for a full batch every round
				// cost it more CPU than anything else it does.
				got[i], err = pgx.AppendRows(make([]claimed, 0, min(p.limit, 16)), rows,
					func(row pgx.CollectableRow) (claimed, error) {
						c, err := scanClaimed(row, now)
						c.lease, c.local = r.roundLease, local
						return c, err
					})
			}
			if err != nil {
				_ = br.Close()
				return &claimError{plan: p, now: now, err: fmt.Errorf("claim %s: %w", p.inst.name, err)}
			}
		}
		if err := br.Close(); err != nil {
			return fmt.Errorf("commit claims and outcomes: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return got, nil
}

// start is where p's scan starts, as claimSQL takes it.
func (p claimPlan) start() pgtype.Timestamptz {
	if p.from.IsZero() {
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: p.from, Valid: true}
}

// buryUnclaimable finds, among the rows the failed claim of ce would take, those that
// claimSQL fails at for their data (see claimProbeSQL), and sends them to dead with a
// reason an operator can act on; it returns how many it sent. Such a row, which only
// plain SQL writes, failed every claim of its connector (and every round's outcomes with
// it), and stopped every relay, for good. A row is sent to dead only when the probe fails
// for the row alone, so a claim that failed for anything else (a constraint an
// application added, say) buries nothing, and is retried as any failure is. The rows are
// locked as the claim locks them and probed together, and only when that is refused one
// by one, each under a savepoint: a claim refused for another reason, retried with
// backoff for as long as the reason stays, costs one probe a try, not one a row.
func (r *Relay) buryUnclaimable(ctx context.Context, ce *claimError) int {
	ctx, cancel := context.WithTimeout(ctx, roundTimeout)
	defer cancel()
	type grave struct {
		id  int64
		key string
		why error
	}
	var buried []grave
	p := ce.plan
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		buried = buried[:0]
		rows, err := tx.Query(ctx, unclaimableDueSQL, p.inst.name, ce.now, p.limit, p.start())
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		probe := func(ids []int64) error {
			return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				_, err := sp.Exec(ctx, claimProbeSQL, ids)
				return err
			})
		}
		if err := probe(ids); err == nil || !refused(err) {
			return err // no row at fault (or the database failed)
		}
		for _, id := range ids {
			why := probe([]int64{id})
			if why == nil {
				continue
			}
			if !refused(why) {
				return why
			}
			var key string
			switch err := tx.QueryRow(ctx, buryUnclaimableSQL, id, unclaimableReason(why), ce.now).Scan(&key); {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return err
			default:
				buried = append(buried, grave{id, key, why})
			}
		}
		return nil
	})
	if err != nil {
		r.log.WarnContext(ctx, "looking for the rows a refused claim cannot take failed", "connector", p.inst.name, "err", err)
		return 0
	}
	for _, g := range buried {
		r.log.ErrorContext(ctx, "the relay cannot claim a row for its data; sent it to dead",
			"connector", p.inst.name, "id", g.id, "key", g.key, "err", g.why)
	}
	if len(buried) > 0 {
		r.rescan.Store(true) // a row of an ordering key sent to dead lets its key's next row go
	}
	return len(buried)
}

// unclaimableReason is the last_error of a row that claimSQL cannot take, refused by
// PostgreSQL with err.
func unclaimableReason(err error) string {
	var pgErr *pgconn.PgError
	errors.As(err, &pgErr)
	what := "its payload or headers cannot be read (a number written out in full past PostgreSQL's 1 GB limit on text, say)"
	if pgErr.Code == "22003" { // numeric_value_out_of_range
		what = "its attempts count is at the integer maximum"
	}
	return storableText(fmt.Sprintf("the relay cannot claim this row: %s, and PostgreSQL refuses it (%s, SQLSTATE %s); "+
		"correct the row with SQL and replay it", what, pgErr.Message, pgErr.Code))
}

// sendWrite sends b, a write of outs (and claims), as one transaction on a connection
// of its own, and reads its results with read, which closes them. When some of outs
// may have been written already by a write whose reply was lost, that write's session
// is ended first (see fence), so that it cannot commit after this one. An error before
// b went out is a notSentError; one after which the connection is closed, a
// lostReplyError, and the connection's session is kept to be ended before whatever
// depends on whether it committed.
func (r *Relay) sendWrite(ctx context.Context, outs []outcome, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	if anyMaybeWritten(outs) {
		if err := r.fencePending(ctx); err != nil {
			return err
		}
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return &notSentError{err}
	}
	defer conn.Release()
	sess, err := sessionOf(ctx, conn)
	if err != nil {
		return &notSentError{err}
	}
	if err = read(conn.SendBatch(ctx, b)); err != nil && conn.Conn().PgConn().IsClosed() {
		r.sessionLost(sess)
		return lostReply(err)
	}
	return err
}

// scanClaimed reads one row of claimSQL, claimed at now.
func scanClaimed(row pgx.CollectableRow, now time.Time) (claimed, error) {
	var (
		c       claimed
		payload []byte // []byte takes jsonb's text as is; json.RawMessage would go through json.Unmarshal
		headers []byte
		// Plain SQL may write ±infinity, which time.Time cannot hold.
		createdAt, firstAt, due pgtype.Timestamptz
	)
	if err := row.Scan(&c.id, &c.key, &payload, &headers, &c.attempt, &c.ambiguous, &createdAt, &firstAt, &c.ordered, &due, &c.parked); err != nil {
		return c, err
	}
	c.payload, c.claimedAt = payload, now
	c.size = int64(len(payload) + len(headers))
	c.createdAt, c.firstAt, c.dueAt = finiteOr(createdAt, now), finiteOr(firstAt, now), finiteOr(due, time.Time{})
	// Most rows carry no headers ('{}'); decode only those that do.
	if len(headers) > 2 {
		c.headers = outbox.DecodeHeaders(headers)
	}
	return c, nil
}

// finiteOr is t's time, or otherwise when t is ±infinity.
func finiteOr(t pgtype.Timestamptz, otherwise time.Time) time.Time {
	if t.InfinityModifier != pgtype.Finite {
		return otherwise
	}
	return t.Time
}

// release hands back rows claimed but not started, within ctx and a time limit of its
// own. If it fails, the claim loop tries again (see releaseAgain); a stopped relay leaves
// them to their lease. Rows another session keeps locked are set aside (see
// setAsideRelease).
func (r *Relay) release(ctx context.Context, rows []claimed) {
	if n, ok := r.releaseRows(ctx, rows); ok && n > 0 {
		r.log.Info("released rows not started", "rows", n)
	}
}

// releaseRows is release without the log line on success, for a row handed back alone
// (see handBack); it returns how many rows it handed back, and whether its statement
// succeeded (the rows another session keeps locked then set aside).
func (r *Relay) releaseRows(ctx context.Context, rows []claimed) (int64, bool) {
	if len(rows) == 0 {
		return 0, false
	}
	n, locked, err := r.handBackRows(ctx, rows)
	if err != nil {
		// Never sent: left to their lease, they would come back as ambiguous attempts
		// (held for an operator, or dead on their last attempt). The claim loop tries
		// again before its next round; a stopped relay leaves them to their lease.
		r.unreleasedMu.Lock()
		r.unreleased = append(r.unreleased, rows...)
		r.anyUnreleased.Store(true)
		r.unreleasedMu.Unlock()
		r.leaveReadOnly(err)
		// Through failed: while the database is away the release is tried again before
		// every round and every reclaim, and a warning each time flooded the log.
		if !stopping(ctx) {
			r.failed(ctx, "release", releaseFailed, err, "rows", len(rows))
		}
		return 0, false
	}
	r.recovered(ctx, releaseFailed)
	r.setAsideRelease(ctx, locked)
	return n, true
}

// handBackRows runs releaseSQL for rows, within ctx and a time limit of its own: it
// returns how many it handed back, and those another session keeps locked, which it
// skipped (see handBackTail).
func (r *Relay) handBackRows(ctx context.Context, rows []claimed) (int64, []claimed, error) {
	ids, attempts, leases := make([]int64, len(rows)), make([]int32, len(rows)), make([]time.Time, len(rows))
	for i, row := range rows {
		ids[i], attempts[i], leases[i] = row.id, int32(row.attempt), row.lease
	}
	return r.execHandBack(ctx, releaseSQL, r.cfg.ID, ids, r.now(), r.stopRequested(), attempts, leases)
}

// execHandBack runs query, a hand-back that ends with handBackTail, with args, within ctx
// and a time limit of its own. It returns how many rows it handed back, and those it
// skipped because another session keeps them locked.
func (r *Relay) execHandBack(ctx context.Context, query string, args ...any) (int64, []claimed, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var (
		n        int64
		ids      []int64
		keys     []string
		attempts []int32
		leases   []time.Time
	)
	if err := r.pool.QueryRow(ctx, query, args...).Scan(&n, nil, &ids, &keys, &attempts, &leases); err != nil {
		return 0, nil, err
	}
	if n > 0 {
		r.rescan.Store(true) // they may lie behind where claims start
	}
	locked := make([]claimed, len(ids))
	for i := range ids {
		locked[i] = claimed{id: ids[i], key: keys[i], attempt: int(attempts[i]), lease: leases[i]}
	}
	return n, locked, nil
}

// sameClaim reports whether a and b are the same claim of one row: its id, attempt and
// lease, which is all a hand-back looks at.
func sameClaim(a, b claimed) bool {
	return a.id == b.id && a.attempt == b.attempt && a.lease.Equal(b.lease)
}

// setAsideRelease sets aside rows whose hand-back found them locked by another session
// (a psql BEGIN; SELECT ... FOR UPDATE left open, an application's transaction), to be
// handed back once the lock is let go (see retryLockedReleases): looked at again with
// backoff, never dropped while the relay runs, and left alone by this relay's reclaim
// meanwhile (see leftAlone), since they were never sent. Each row is said once.
func (r *Relay) setAsideRelease(ctx context.Context, rows []claimed) {
	r.unreleasedMu.Lock()
	rows = slices.DeleteFunc(rows, func(c claimed) bool {
		return slices.ContainsFunc(r.releaseLocks.outs, func(o claimed) bool { return sameClaim(o, c) })
	})
	r.releaseLocks.add(rows)
	r.unreleasedMu.Unlock()
	for _, row := range rows {
		r.metrics.dbErrors.WithLabelValues("release").Inc()
		r.log.WarnContext(ctx, "another database session holds a lock on a row this relay claimed but did not start, and keeps it: "+
			"the relay claims and writes outcomes without it, and hands it back once the lock is let go; "+
			"pg_stat_activity shows the session holding it (often idle in transaction)",
			"id", row.id, "key", row.key, "attempt", row.attempt)
	}
}

// retryLockedReleases hands back, once it is time to look (see lockWaits), the rows set
// aside because another session kept them locked (see setAsideRelease), without waiting
// for a lock; those still locked stay aside for another look, later, and those no
// longer this relay's (claimed again since, or changed by the session that locked them)
// are forgotten. They stay listed while the hand-back runs, so that a reclaim meanwhile
// leaves them alone.
func (r *Relay) retryLockedReleases(ctx context.Context) {
	r.unreleasedMu.Lock()
	var due []claimed
	if r.releaseLocks.due(time.Now()) {
		due = slices.Clone(r.releaseLocks.outs)
	}
	r.unreleasedMu.Unlock()
	if len(due) == 0 {
		return
	}
	n, locked, err := r.handBackRows(ctx, due)
	r.unreleasedMu.Lock()
	if err == nil {
		r.releaseLocks.outs = slices.DeleteFunc(r.releaseLocks.outs, func(o claimed) bool {
			tried := slices.ContainsFunc(due, func(c claimed) bool { return sameClaim(o, c) })
			return tried && !slices.ContainsFunc(locked, func(c claimed) bool { return sameClaim(o, c) })
		})
	}
	r.releaseLocks.looked()
	r.unreleasedMu.Unlock()
	if err != nil {
		r.leaveReadOnly(err)
		if !stopping(ctx) {
			r.failed(ctx, "release", releaseFailed, err, "rows", len(due))
		}
		return
	}
	r.recovered(ctx, releaseFailed)
	if n > 0 {
		r.log.InfoContext(ctx, "handed back rows not started that waited for another session's lock", "rows", n)
	}
}

// releaseLocksDue reports whether rows set aside for another session's lock are to be
// looked at again now (see retryLockedReleases).
func (r *Relay) releaseLocksDue() bool {
	r.unreleasedMu.Lock()
	defer r.unreleasedMu.Unlock()
	return r.releaseLocks.due(time.Now())
}

// releaseLockWait is how long from now until the rows set aside for another session's
// lock are looked at again (0: none is set aside).
func (r *Relay) releaseLockWait(now time.Time) time.Duration {
	r.unreleasedMu.Lock()
	defer r.unreleasedMu.Unlock()
	return r.releaseLocks.wait(now)
}

// stopRequested reports whether Run was asked to stop: the relay claims no more rows
// (a round in flight then hands back what it claimed), so rows it gives up now are for
// the other relays.
func (r *Relay) stopRequested() bool {
	done := r.runDone.Load()
	return done != nil && isClosed(*done)
}

// ownInstances is the instances whose rows this relay claims itself, for lockNextSQL:
// its instances, and none once it was asked to stop (the keys' next rows it lets go are
// then for the relays still running).
func (r *Relay) ownInstances() []string {
	if r.stopRequested() {
		return []string{}
	}
	return nonNil(r.names)
}

// releaseFailed is the warning of a release that failed (see failed).
const releaseFailed = "could not release unstarted rows; trying again when the database answers, else they are retried when their lease expires"

// releaseAgain hands back the rows of rounds whose reply was lost and retries the
// releases that failed (see release), within ctx; what fails again stays for the next
// call. It also hands back, when it is time to look again, the rows set aside because
// another session kept them locked (see retryLockedReleases).
func (r *Relay) releaseAgain(ctx context.Context) {
	r.releasingMu.Lock()
	defer r.releasingMu.Unlock()
	r.unreleasedMu.Lock()
	rows, lost := r.unreleased, r.lost
	r.unreleased, r.lost = nil, nil
	r.anyUnreleased.Store(false)
	r.unreleasedMu.Unlock()
	if len(lost) > 0 {
		err := r.fencePending(ctx)
		if err == nil {
			err = r.releaseLost(ctx, lost, 10*time.Second)
		}
		if err != nil {
			r.unreleasedMu.Lock()
			r.lost = append(r.lost, lost...)
			r.anyUnreleased.Store(true)
			r.unreleasedMu.Unlock()
			r.leaveReadOnly(err)
			// Said, as a failed release is: until it succeeds, the rows of those rounds
			// stay leased to this relay, and reclaim waits.
			if !stopping(ctx) {
				r.failed(ctx, "release", releaseLostFailed, err, "rounds", len(lost))
			}
		} else {
			r.recovered(ctx, releaseLostFailed)
		}
	}
	r.release(ctx, rows)
	r.retryLockedReleases(ctx)
}

// releaseLostFailed is the warning of a hand-back of the rows of rounds whose reply was
// lost that failed (see failed).
const releaseLostFailed = "could not hand back the rows claimed in rounds whose reply was lost; trying again, and reclaiming expired leases waits until it succeeds"

// sessionLost notes the session of a write whose reply was lost, to be ended before
// anything that depends on whether it committed (see fence); a zero session is left.
func (r *Relay) sessionLost(s session) {
	if s.pid == 0 {
		return
	}
	r.unreleasedMu.Lock()
	defer r.unreleasedMu.Unlock()
	r.unfenced = append(r.unfenced, s)
}

// fencePending ends the sessions of the writes whose reply was lost (see fence); those
// it could not end stay for the next call. A session stays listed until it has ended:
// a caller that comes while another's fence runs (reclaim's releaseAgain and the claim
// loop, the stopping relay's releases and its recorder) ends it too, rather than going
// on while it may still run.
func (r *Relay) fencePending(ctx context.Context) error {
	r.unreleasedMu.Lock()
	sessions := slices.Clone(r.unfenced)
	r.unreleasedMu.Unlock()
	if len(sessions) == 0 {
		return nil
	}
	if err := r.fence(ctx, sessions); err != nil {
		return err
	}
	r.unreleasedMu.Lock()
	r.unfenced = slices.DeleteFunc(r.unfenced, func(s session) bool { return slices.Contains(sessions, s) })
	r.unreleasedMu.Unlock()
	return nil
}

// roundLost notes that the reply of the claim loop's last round was lost: the rows it
// may have claimed are handed back before the next round (see releaseAgain).
func (r *Relay) roundLost() {
	if r.roundLease.IsZero() {
		return // it claimed nothing
	}
	r.unreleasedMu.Lock()
	defer r.unreleasedMu.Unlock()
	r.lost = append(r.lost, r.roundLease)
	r.anyUnreleased.Store(true)
}

// session is a database session the relay ran a round in: its backend's process id and
// start. Zero: one the relay cannot end (a connection pooler's, see sessionOf).
type session struct {
	pid   uint32
	start time.Time
}

// sessionOf returns the session of conn, read from the database on the connection's
// first round and kept with it. Behind a connection pooler the process id the client
// was given is the pooler's, not the backend's that answers: such a session is zero,
// and fence leaves it alone. So is one whose start the relay's role may not read (see
// sessionSQL).
func sessionOf(ctx context.Context, conn *pgxpool.Conn) (session, error) {
	const key = "outboxd.relay.session"
	pc := conn.Conn().PgConn()
	if s, ok := pc.CustomData()[key].(session); ok {
		return s, nil
	}
	var (
		pid   int64
		start *time.Time
	)
	if err := conn.QueryRow(ctx, sessionSQL).Scan(&pid, &start); err != nil {
		return session{}, fmt.Errorf("read the session: %w", err)
	}
	var s session
	if pid == int64(pc.PID()) && start != nil {
		s = session{pid: pc.PID(), start: *start}
	}
	pc.CustomData()[key] = s
	return s, nil
}

// fence ends the sessions of rounds whose reply was lost, and waits until they have
// ended, before their rows are handed back: a round whose connection broke may still run
// in the database (waiting for a lock, its cancel request lost with the network) and
// commit its claims after the hand-back found nothing, leaving rows leased to this relay
// that no worker will see, to come back as ambiguous attempts when the lease expires.
// Ended, the round has committed or never will. A session is known by its backend's
// process id and start, and only this relay's own role's are ended (see fenceSQL). It
// fails when a session did not end within fenceWait.
func (r *Relay) fence(ctx context.Context, sessions []session) error {
	pids, starts := make([]int64, 0, len(sessions)), make([]time.Time, 0, len(sessions))
	for _, s := range sessions {
		if s.pid != 0 {
			pids, starts = append(pids, int64(s.pid)), append(starts, s.start)
		}
	}
	if len(pids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, fenceWait+10*time.Second)
	defer cancel()
	// Twice when the first says a session did not end: one that exited by itself (or
	// was ended by another fence) after the statement's view of pg_stat_activity was
	// taken cannot be ended again, and the next look no longer finds it.
	for range 2 {
		var ended bool
		if err := r.pool.QueryRow(ctx, fenceSQL, pids, starts, fenceWait.Milliseconds()).Scan(&ended); err != nil {
			return fmt.Errorf("end the sessions of writes whose reply was lost: %w", err)
		}
		if ended {
			return nil
		}
	}
	return fmt.Errorf("the sessions of writes whose reply was lost did not end within %s", fenceWait)
}

// fenceWait bounds how long fence waits for a session to end.
const fenceWait = 5 * time.Second

// releaseLost hands back the rows claimed in rounds whose reply was lost, by their
// rounds' leases (see releaseLostSQL). Should it fail, releaseAgain tries again; a relay
// stopped before it succeeds leaves the rows to their lease.
func (r *Relay) releaseLost(ctx context.Context, leases []time.Time, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// When the relay was asked to stop, the rows are for the other relays now, and the
	// statement wakes them.
	n, locked, err := r.execHandBack(ctx, releaseLostSQL, r.cfg.ID, leases, r.now(), r.stopRequested())
	if err != nil {
		return err
	}
	if n > 0 {
		r.log.WarnContext(ctx, "released rows claimed in a round whose reply was lost", "rows", n)
	}
	// Those another session keeps locked are now known one by one: handed back later, as
	// any row set aside for a lock.
	r.setAsideRelease(ctx, locked)
	return nil
}

// work is one of inst's delivery workers: it takes the instance's claimed rows and
// delivers each once a slot is free, until the relay stops (ctx is done) and the rows
// run out. Rows it has not started by then are handed back at once, and a row that waited
// longer than inst.startBy, for the worker or for the slot, is handed back.
func (r *Relay) work(ctx, deliverCtx context.Context, inst *instance) {
	// The worker's own child of deliverCtx: each attempt's timeout (a child of the
	// context it is given) registers with the worker's context instead of all of them
	// with deliverCtx, whose one lock every worker would take twice per attempt. With
	// 128 goroutines on two cores, a timeout and its cancel took 1.3 µs that way and
	// 0.45 µs this way (a scratch benchmark of the two, not kept).
	deliverCtx, cancel := context.WithCancel(deliverCtx)
	defer cancel()
	for row := range inst.jobs {
		started := false
		// In time is looked at before the wait for a slot (a row too late already does
		// not wait), and again once the slot is this worker's: other instances' attempts
		// can hold every slot for longer than a lease, and a row sent after its lease ran
		// out may already be on its way from another relay.
		inTime := func() bool { return ctx.Err() == nil && r.cfg.NowFunc().Sub(row.local) <= inst.startBy }
		if inTime() {
			if slot := r.takeSlot(ctx, inst, row); slot != nil {
				if inst.holds {
					inst.slotted.Add(1)
				}
				if started = inTime(); started {
					r.deliver(deliverCtx, inst, row)
				}
				if inst.holds {
					inst.slotted.Add(-1) // before the slot goes: never counted free twice
				}
				<-slot
			}
		}
		if !started {
			r.handBack(ctx, inst, row)
		}
		r.done(inst, row)
	}
}

// takeSlot waits for a delivery slot for row and returns the slots' channel it took one
// of (the shared slots, or the instance's own), nil when it got none. It gives up
// when the relay stops, and once the row can no longer start within inst.startBy of its
// claim: other instances' attempts can hold every shared slot for longer than a lease (a
// slow attempt, or several queued for the slot before this one), and a row still waiting
// when its lease ran out would come back as an ambiguous attempt that never happened.
func (r *Relay) takeSlot(ctx context.Context, inst *instance, row claimed) chan struct{} {
	// A shared slot first, then the instance's own (never ready when nil): each a
	// select of one case, which costs less than one of two.
	select {
	case r.slots <- struct{}{}:
		return r.slots
	default:
	}
	select {
	case inst.ownSlot <- struct{}{}:
		return inst.ownSlot
	default:
	}
	for {
		left := row.local.Add(inst.startBy).Sub(r.cfg.NowFunc())
		if left < 0 || ctx.Err() != nil {
			return nil
		}
		// At least minSlotRecheck: an injected clock may not move while the worker waits.
		t := time.NewTimer(max(left, minSlotRecheck))
		select {
		case r.slots <- struct{}{}:
			t.Stop()
			return r.slots
		case inst.ownSlot <- struct{}{}:
			t.Stop()
			return inst.ownSlot
		case <-ctx.Done():
			// Stopping: the slot may stay taken until the attempts in flight end,
			// and the row would not start then anyway.
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// reserveSlots returns how many of concurrency's delivery slots are kept one for each of
// n instances, so that one slow receiver, whose attempts would hold every slot they may
// (an instance's Concurrency defaults to Config.Concurrency), never starves the others:
// each instance always has a slot no other can take. None with one instance, or with
// fewer than two slots for each (the shared slots would be too few).
func reserveSlots(concurrency, n int) int {
	if n < 2 || concurrency < 2*n {
		return 0
	}
	return n
}

// inFlight returns how many deliveries are in flight: the slots taken, shared and own.
func (r *Relay) inFlight() int {
	n := len(r.slots)
	for _, own := range r.ownSlots {
		n += len(own)
	}
	return n
}

// minSlotRecheck is the shortest wait between two looks at whether a row waiting for a
// slot is still in time.
const minSlotRecheck = 10 * time.Millisecond

// done counts off a claimed row that a worker is done with, sent or handed back, and
// lets the claim loop fill its place.
func (r *Relay) done(inst *instance, row claimed) {
	inst.claimed.Add(-1)
	r.claimedRows.Add(-1)
	r.claimedBytes.Add(-row.size)
	if row.ordered {
		r.claimedOrdered.Add(-1)
	}
	notify(r.slotFreed)
}

// handBack gives up a claimed row without an attempt, and releases it at once: the relay
// is stopping, or the row waited too long for a worker or a slot.
func (r *Relay) handBack(ctx context.Context, inst *instance, row claimed) {
	if inst.limiter != nil {
		inst.unsent.Add(-1) // its token is left for the next claim
	}
	if ctx.Err() != nil {
		r.releaseRows(context.Background(), []claimed{row})
		return
	}
	r.metrics.handedBack.Inc()
	// Behind other instances' slow attempts, every row claimed ahead is handed back, claimed
	// again and handed back again while they last: one warning per instance every
	// handBackWarnEvery, saying how many more were handed back since (the metric counts
	// each).
	now := r.cfg.NowFunc()
	if more, ok := inst.handBackWarning(now); ok {
		r.log.WarnContext(ctx, "a claimed row waited too long for a free worker or delivery slot; handing it back",
			"connector", inst.name, "id", row.id, "waited", now.Sub(row.local).Round(time.Millisecond), "limit", inst.startBy,
			"more_since_last_warning", more)
	}
	r.releaseRows(context.Background(), []claimed{row})
}

// handBackWarnEvery is the least time between two warnings about rows of one instance
// handed back.
const handBackWarnEvery = 10 * time.Second

// handBackWarning reports whether a row handed back at now is to be warned about, and
// how many were handed back unmentioned since the last warning.
func (inst *instance) handBackWarning(now time.Time) (more int64, ok bool) {
	inst.handBackMu.Lock()
	defer inst.handBackMu.Unlock()
	if !inst.handBackWarned.IsZero() && now.Sub(inst.handBackWarned) < handBackWarnEvery {
		inst.handBackQuiet++
		return 0, false
	}
	more, inst.handBackQuiet, inst.handBackWarned = inst.handBackQuiet, 0, now
	return more, true
}

// deliver makes one attempt and queues its outcome.
func (r *Relay) deliver(ctx context.Context, inst *instance, row claimed) {
	// The attempt's times are on the relay's clock, for the attempts log; how long it
	// took is measured on the uncorrected readings, as a claimed row's wait is (see
	// claimed.local): a new correction meanwhile (readClock) is no part of it.
	local := r.cfg.NowFunc()
	started := r.corrected(local)
	if inst.limiter != nil {
		// The token its claim left it, taken as the request goes rather than at the
		// claim: a row that waited for a delivery slot (other instances' attempts held
		// them all) would otherwise go out together with the rows claimed on the tokens
		// that came meanwhile, faster than the rate, which the receiver answers with 429.
		// On the uncorrected reading (see claimRound).
		inst.takeToken(local)
		inst.unsent.Add(-1)
	}
	if inst.forgotten(row, started) {
		// Not sent: the receiver no longer knows the key (see decide).
		r.noteUnwritten(row)
		r.results <- r.holdForgotten(inst, row, started)
		return
	}
	result, err := safeDeliver(ctx, inst.conn, connectors.Delivery{
		Key: row.key, Attempt: row.attempt, Payload: row.payload, Headers: row.headers, PreviousAmbiguous: row.ambiguous,
		FirstAttemptAt: row.firstAt,
	})
	if p := (*connectorPanic)(nil); errors.As(err, &p) {
		r.log.ErrorContext(ctx, "connector panicked; the attempt is recorded as ambiguous (the request may have gone out)",
			"connector", inst.name, "key", row.key, "attempt", row.attempt, "panic", fmt.Sprint(p.value), "stack", string(p.stack))
	}
	finishedLocal := r.cfg.NowFunc()
	finished := r.corrected(finishedLocal)
	if err != nil && ctx.Err() != nil && stoppedBy(ctx, err) {
		// Cancelled at the shutdown timeout. A connector marks ambiguous an attempt whose
		// request may have gone out; one it does not (nor permanent) sent nothing the
		// receiver could act on, so it is no attempt: the row goes back as one never
		// started, its attempt uncounted, rather than held or dead on its last attempt.
		// (An error that is not the cancel's is the receiver's answer, come as the
		// timeout struck: it is decided as any other, its Retry-After kept.)
		if !connectors.IsAmbiguous(err) && !connectors.IsPermanent(err) {
			r.releaseRows(context.Background(), []claimed{row})
			return
		}
		if cause := context.Cause(ctx); !errors.Is(err, cause) {
			// Named once: a connector's error may say why its context ended already.
			err = fmt.Errorf("%w (cancelled: %v)", err, cause)
		}
		err = connectors.Ambiguous(err)
	}
	o := r.decide(inst, row, result, err, finished)
	o.started = started
	took := finishedLocal.Sub(local)
	inst.observe(o.record, took, finished.Sub(row.committedFor()))
	inst.observeTook(took)
	r.noteUnwritten(row)
	r.results <- o
}

// takeToken takes the token of a request of a rate-limited instance that goes at local
// (an uncorrected reading), and notes it in the instance's window. A worker can be
// preempted between its reading and this call, and another's later reading take its
// token first: the limiter takes the time it is given as its last request's, and the
// time between the two readings then counted as gone by twice, a token (or more) too
// many for the next claim. So a request takes its token no earlier than the last.
func (inst *instance) takeToken(local time.Time) {
	inst.tokenMu.Lock()
	defer inst.tokenMu.Unlock()
	if local.Before(inst.tokenAt) {
		local = inst.tokenAt
	}
	inst.tokenAt = local
	inst.limiter.AllowN(local, 1)
	if inst.window != nil {
		inst.window.sent(local)
	}
}

// noteUnwritten notes that row's attempt has ended, its outcome not yet written, until
// written (see written). The outcome may wait in memory past the row's lease (the
// database away for longer, a round stuck on a lock), and this relay's own reclaim
// would then put the row back as an abandoned, ambiguous attempt, and throw away the
// answer it holds: a permanent refusal sent again, a receiver's Retry-After ignored, a
// row of an instance with the hold policy held for an operator. Other relays, which do
// not know the answer, still put it back once the lease has expired.
func (r *Relay) noteUnwritten(row claimed) {
	r.unwrittenMu.Lock()
	defer r.unwrittenMu.Unlock()
	r.unwritten[rowAttempt{row.id, row.attempt}] = row.lease
}

// written forgets outs, outcomes written (or given up: their rows are left to reclaim).
func (r *Relay) written(outs []outcome) {
	if len(outs) == 0 {
		return
	}
	r.unwrittenMu.Lock()
	defer r.unwrittenMu.Unlock()
	for _, o := range outs {
		delete(r.unwritten, rowAttempt{o.id, o.attempt})
		if !o.lockedSince.IsZero() {
			r.log.Info("the outcome that waited for another session's lock is written", "id", o.id, "key", o.key,
				"attempt", o.attempt, "waited", r.cfg.NowFunc().Sub(o.lockedSince).Round(time.Millisecond))
		}
	}
}

// leftAlone returns the rows of this relay for reclaim to leave alone, since their
// attempts were not abandoned: those whose outcomes it holds unwritten and whose leases
// expired by now, and those it never started and hands back once another session lets
// go of its lock on them (see setAsideRelease), which would otherwise come back as
// ambiguous attempts that never happened.
func (r *Relay) leftAlone(now time.Time) []int64 {
	ids := []int64{} // not nil: NULL would leave every row of this relay alone
	r.unwrittenMu.Lock()
	for a, lease := range r.unwritten {
		if lease.Before(now) {
			ids = append(ids, a.id)
		}
	}
	r.unwrittenMu.Unlock()
	r.unreleasedMu.Lock()
	for _, row := range r.releaseLocks.outs {
		ids = append(ids, row.id)
	}
	r.unreleasedMu.Unlock()
	return ids
}

// AttemptMax is the longest an attempt of c may last under a relay whose leases last
// lease: c's time limit ([connectors.Timeouter]), or the lease when it declares none or a
// longer one (an attempt never outlives its lease).
func AttemptMax(c connectors.Connector, lease time.Duration) time.Duration {
	return min(cmp.Or(connectors.Timeout(c), lease), lease)
}

// forgotten reports whether an attempt of row started at t could reach an enforcing
// receiver after it has forgotten the row's key (the attempt may take up to attemptMax):
// the retry would be a blind duplicate.
func (inst *instance) forgotten(row claimed, t time.Time) bool {
	return inst.guarantee == connectors.Enforced && connectors.KeyForgotten(inst.keyWindow, inst.attemptMax, row.firstAt, t)
}

// forgottenReason says why row is held: a retry at when ("now", or the time decide
// scheduled, which a receiver's Retry-After may have set) could come after inst's
// receiver has forgotten its key.
func forgottenReason(inst *instance, row claimed, when string) string {
	return fmt.Sprintf("held: %s remembers idempotency keys for %s and the first attempt was at %s, so a retry %s could act twice; "+
		"check the receiver, then replay with a new key or cancel", inst.name, inst.keyWindow, row.firstAt.UTC().Format(time.RFC3339), when)
}

// holdForgotten is the outcome of an attempt not made because the key window passed.
func (r *Relay) holdForgotten(inst *instance, row claimed, now time.Time) outcome {
	msg := fmt.Sprintf("attempt %d not sent: %s", row.attempt, forgottenReason(inst, row, "now"))
	inst.outcomes[statusHeld].Inc() // no duration: the connector was not called
	return outcome{id: row.id, key: row.key, attempt: row.attempt, status: statusHeld, lastError: &msg,
		started: now, finished: now, record: statusHeld, ordered: row.ordered}
}

// stoppedBy reports whether err is ctx's end (its cancel, deadline or cause) rather than
// an answer that came meanwhile.
func stoppedBy(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Cause(ctx))
}

// safeDeliver turns a connector's panic into an ambiguous error: the connector may have
// sent its request before it panicked (reading the answer, say), so the receiver may have
// acted, as when a relay dies mid-attempt. So does a panic of the error it returns (see
// lookAt).
func safeDeliver(ctx context.Context, c connectors.Connector, d connectors.Delivery) (res json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, connectors.Ambiguous(&connectorPanic{value: p, stack: debug.Stack()})
		}
	}()
	res, err = c.Deliver(ctx, d)
	if err != nil {
		lookAt(err)
	}
	return res, err
}

// lookAt calls what the relay calls of a connector's error once Deliver has returned
// (its message, its class, its delay, what it wraps), for safeDeliver's recover to catch
// a panic there. A typed nil of a connector's own error type (returned through a
// variable of that type, nil when the receiver took the request) is a non-nil error
// whose methods dereference a nil pointer: looked at first on the delivery worker's
// goroutine, it killed the process the relay runs in (a panic in Unwrap, through
// errors.As), or was a plain failure, "<nil>", retried as if nothing had gone out (one in
// Error, which fmt recovers).
func lookAt(err error) {
	_ = err.Error()
	_ = connectors.IsAmbiguous(err)
	_ = connectors.IsPermanent(err)
	_, _ = connectors.RetryDelay(err)
	_ = errors.Is(err, context.Canceled)
	_ = errors.As(err, new(*connectorPanic))
}

// connectorPanic is a connector's panic, with the stack that led to it for the log
// (last_error gets only the value).
type connectorPanic struct {
	value any
	stack []byte
}

func (p *connectorPanic) Error() string { return fmt.Sprintf("connector panicked: %v", p.value) }

const (
	statusPending   = "pending"
	statusDelivered = "delivered"
	statusDead      = "dead"
	statusHeld      = "held"
)

// decide turns an attempt's result into the row's next state.
func (r *Relay) decide(inst *instance, row claimed, result json.RawMessage, err error, now time.Time) outcome {
	o := outcome{id: row.id, key: row.key, attempt: row.attempt, finished: now, ordered: row.ordered}
	if len(result) > 0 && json.Valid(result) {
		o.result = storableJSON(result)
	}
	if err == nil {
		o.status, o.record = statusDelivered, statusDelivered
		return o
	}
	o.ambiguous = connectors.IsAmbiguous(err)
	msg := fmt.Sprintf("attempt %d: %v", row.attempt, err)
	switch {
	case o.ambiguous && inst.holds:
		// Before permanent: an answer both ambiguous and final (a 303) is an ambiguous
		// attempt too, and dead would let its ordering key's next row go undecided.
		o.status = statusHeld
		msg += " (the receiver does not enforce the key, so the row is held: replay or cancel it)"
	case connectors.IsPermanent(err):
		o.status = statusDead
		msg += " (permanent: not retried)"
	case row.attempt >= r.cfg.MaxAttempts:
		o.status = statusDead
		msg += fmt.Sprintf(" (gave up after %d attempts)", row.attempt)
	default:
		delay, hasDelay := connectors.RetryDelay(err)
		next := nextAttemptAt(now, row.attempt, delay, hasDelay, r.cfg.BackoffBase, r.cfg.BackoffMax)
		// Say when the receiver set the time: a retry days away (or a row dead for it)
		// otherwise reads as the relay's own doing.
		at := next.UTC().Format(time.RFC3339)
		if hasDelay && delay > 0 {
			at += fmt.Sprintf(", %s later as the receiver's Retry-After asked", delay)
		}
		if deadline := row.firstAt.Add(inst.maxAge); next.After(deadline) {
			o.status = statusDead
			// A maximum age the key window set is one the operator configured nowhere.
			why := ""
			if inst.windowAge {
				why = fmt.Sprintf(" (%s remembers idempotency keys for %s, less the attempt's time limit of %s)", inst.name, inst.keyWindow, inst.attemptMax)
			}
			msg += fmt.Sprintf(" (gave up: the next attempt, at %s, would be later than the maximum age %s%s)", at, inst.maxAge, why)
		} else if inst.forgotten(row, next) {
			o.status = statusHeld
			// Not "now": the retry was due later (at says when, and whether the receiver
			// asked for that wait), and now may lie well inside the window.
			when := "at " + at
			if hasDelay && delay > 0 {
				when += "," // closes the clause about the Retry-After
			}
			msg += " (" + forgottenReason(inst, row, when) + ")"
		} else {
			o.status = statusPending
			o.nextAt = &next
			msg += fmt.Sprintf(" (retrying at %s)", at)
		}
	}
	msg = storableText(msg)
	o.lastError = &msg
	o.record = o.status
	if o.status == statusPending {
		o.record = "retry"
	}
	return o
}

// storableText replaces what PostgreSQL's text cannot hold, NUL and bytes that are not
// UTF-8, with U+FFFD: a receiver's answer quoted in an error must never make its outcome
// unrecordable.
func storableText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// storableJSON makes valid JSON storable as jsonb: bytes that are not UTF-8 become
// U+FFFD, and so does the escape \u0000, which jsonb rejects. (Valid JSON holds no raw
// NUL.) An escaped backslash before "u0000" is changed too; the result is an excerpt for
// people, so that is harmless.
func storableJSON(b []byte) []byte {
	if !utf8.Valid(b) {
		b = bytes.ToValidUTF8(b, []byte("\uFFFD"))
	}
	nul := []byte(`\u0000`)
	if !bytes.Contains(b, nul) {
		return b
	}
	return bytes.ReplaceAll(b, nul, []byte(`\ufffd`))
}

// claimError is a round's failure at the claim of plan, made at now (the database's
// clock, as the relay reads it).
type claimError struct {
	plan claimPlan
	now  time.Time
	err  error
}

func (e *claimError) Error() string { return e.err.Error() }
func (e *claimError) Unwrap() error { return e.err }

// outcomesError is a round's failure to write its outcomes, as opposed to its claims.
type outcomesError struct{ err error }

func (e *outcomesError) Error() string { return e.err.Error() }
func (e *outcomesError) Unwrap() error { return e.err }

// refused reports whether PostgreSQL rejected a statement for the data it was given (a
// data exception, a constraint, a limit), which no retry of the same data can mend.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

// The warnings of the claim loop and of the final writes of outcomes, which say the
// same at every failure (see failed).
const (
	claimFailed  = "claiming and recording failed; retrying"
	recordFailed = "recording outcomes failed; retrying"
)

// takesNoWrites reports whether err is PostgreSQL refusing a write because the server
// takes none (SQLSTATE 25006): a hot standby, a demoted primary, a database set
// default_transaction_read_only.
func takesNoWrites(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006" // read_only_sql_transaction
}

// salvage writes outs after PostgreSQL refused them as one batch for their data
// (refusal): it writes each half as a batch of its own, and splits a refused half
// again, down to the outcome refused alone, which it records without the receiver's
// answer, the reason added to its error. So an answer nobody foresaw never stops a relay
// from recording outcomes and claiming rows, and the others are written in a few
// statements. An outcome refused even without its answer is given up: its row stays
// leased and is retried, as ambiguous, when the lease expires. salvage returns the
// outcomes it could not write for another reason (the database went away, or a write
// took longer than roundTimeout), to be retried with the others.
func (r *Relay) salvage(ctx context.Context, outs []outcome, refusal error) []outcome {
	write := func(batch []outcome) error { return r.writeApart(ctx, batch) }
	if len(outs) == 1 {
		o := outs[0]
		r.log.ErrorContext(ctx, "the database refused an outcome; recording it without the receiver's answer",
			"id", o.id, "attempt", o.attempt, "err", refusal)
		switch err := write([]outcome{withoutAnswer(o, refusal)}); {
		case err == nil:
			return nil
		case refused(err):
			r.metrics.dbErrors.WithLabelValues("record").Inc()
			r.log.ErrorContext(ctx, "the database refused an outcome even without the receiver's answer; the row is retried when its lease expires",
				"id", o.id, "attempt", o.attempt, "err", err)
			r.written(outs) // given up: left to reclaim
			return nil
		default:
			if unsure(err) { // the copy without the answer was marked, not outs
				markMaybeWritten(outs)
			}
			return outs
		}
	}
	parts := [][]outcome{outs[:len(outs)/2], outs[len(outs)/2:]}
	for i, part := range parts {
		err := write(part)
		if err != nil && refused(err) {
			if left := r.salvage(ctx, part, err); len(left) > 0 {
				return slices.Concat(left, slices.Concat(parts[i+1:]...))
			}
			continue
		}
		if err != nil {
			return slices.Concat(parts[i:]...)
		}
	}
	return nil
}

// writeApart writes batch in a transaction of its own, without claims, for salvage and
// writeAround, and marks it written (or perhaps written, when the reply was lost).
func (r *Relay) writeApart(ctx context.Context, batch []outcome) error {
	// Bounded, as a round is: the claim loop, whose context has no time limit, writes no
	// other outcome and claims no row until salvage or writeAround returns, and a
	// connection that hangs (a network that drops packets without a reset) held it for as
	// long as the kernel retransmitted, while the leases of the rows it sent ran out and
	// other relays sent them again. A write cut short is unsure, and written again.
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(r.salvageTimeout, roundTimeout))
	defer cancel()
	err := r.execRecord(ctx, batch, r.recordArgs(batch))
	if unsure(err) {
		markMaybeWritten(batch)
	}
	if err == nil {
		r.written(batch)
	}
	if err == nil && anyOrdered(batch) {
		r.rescan.Store(true) // as in claimRound: written without a claim, the key's next row may lie behind
	}
	return err
}

// Row locks of other sessions. A row in flight, or the next row of its ordering key, may
// be locked by a session that keeps it (an operator's BEGIN; SELECT ... FOR UPDATE left
// open in psql, an application's transaction that locked it). The write of its outcome
// then waits, and so did the whole round it rode in: no other outcome was written and no
// row claimed, the round was cut at roundTimeout and sent again, the same, for as long
// as the lock was kept, while the leases of every row the relay held ran out and other
// relays sent them again. So each write of outcomes waits at most recordLockWait for a
// row's lock (recordLockWaitGate) and fails then (SQLSTATE 55P03); the outcomes are written
// apart from the claims, but those waiting for a lock, which are set aside and tried
// again with backoff (lockWaits) until the lock is let go, never given up while the
// relay runs. A row's lock holds up its own outcome only (and, for an ordering key, only
// that key: its next row waits for the outcome), never the relay's other outcomes and
// claims.
//
// An outcome set aside stays noted as unwritten (noteUnwritten): this relay's reclaim
// leaves its row alone, and other relays' reclaims skip a locked row. Once the lock is
// let go, the row's lease may have expired and another relay put it back, or taken it
// again: the outcome is then a late one, which recordSQL takes or only logs, as for any
// late outcome.

// recordLockWait is how long a write of outcomes waits for a lock before it fails: far
// longer than the locks rounds, parking passes and operators' decisions hold for
// milliseconds, so that they are waited for as before; a lock kept longer costs every
// round that meets it that long.
const recordLockWait = time.Second

// recordLockWaitMillis is recordLockWait as recordLockWaitSQL and recordLockWaitGate
// take it.
var recordLockWaitMillis = strconv.FormatInt(recordLockWait.Milliseconds(), 10)

// lockTimedOut reports whether err is PostgreSQL cutting short a wait for a lock
// (SQLSTATE 55P03, lock_not_available), as recordLockWaitSQL and recordLockWaitGate ask.
func lockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}

// endsOrdered reports whether o ends a row of an ordering key (delivered or dead), so
// that its write lets the key's next row go (queueRelease).
func (o outcome) endsOrdered() bool {
	return o.ordered && !o.nextLocked && (o.status == outbox.StatusDelivered || o.status == outbox.StatusDead)
}

// splitLocked splits outs by locked (lockedOutcomes): blocked are those whose own row
// another session keeps locked; free the others, to be written now. An outcome held up
// only by a lock on the next row of its ordering key is free, marked nextLocked: its own
// row is not locked, so no relay's reclaim skips it, and withheld past its lease it was
// put back as an abandoned attempt and sent again, though this relay holds its answer.
// Written without letting the next row go, that row, when parked behind it, goes when
// its parking ends, as after a reclaim that finds it locked.
func (r *Relay) splitLocked(ctx context.Context, outs []outcome, locked map[int64]int64) (free, blocked []outcome) {
	for _, o := range outs {
		row, ok := locked[o.id]
		switch {
		case !ok:
			free = append(free, o)
		case row != o.id:
			if !o.nextLocked {
				o.nextLocked = true
				r.metrics.dbErrors.WithLabelValues("record").Inc()
				r.log.WarnContext(ctx, "another database session keeps locked the next row of an ordering key whose row's "+
					"outcome the relay writes: the outcome is written without letting the next row go, which goes when "+
					"its parking ends, within a minute, once the lock is let go; pg_stat_activity shows the session "+
					"holding it (often idle in transaction)", "id", o.id, "key", o.key, "attempt", o.attempt,
					"outcome", o.record, "locked_row", row)
			}
			free = append(free, o)
		default:
			blocked = append(blocked, r.lockWait(ctx, o, row))
		}
	}
	return free, blocked
}

// lockWaits is what is set aside because its write waits for a lock another session
// holds, and when it is next looked at: the claim loop's outcomes (see writeAround), and
// the rows claimed but not started whose hand-backs found them locked (see
// setAsideRelease).
type lockWaits[T any] struct {
	outs    []T
	tries   int       // looks since the last one was set aside, for the backoff
	retryAt time.Time // on the monotonic clock
}

// lockRetryBase and lockRetryMax bound the backoff between two looks at whether what is
// set aside is still waiting for a lock: a look takes no lock wait, but every round need
// not make it.
const (
	lockRetryBase = 100 * time.Millisecond
	lockRetryMax  = 2 * time.Second
)

// add sets outs aside, to be looked at again after lockRetryBase.
func (w *lockWaits[T]) add(outs []T) {
	if len(outs) == 0 {
		return
	}
	w.outs = append(w.outs, outs...)
	w.tries = 1
	w.retryAt = time.Now().Add(backoff(w.tries, lockRetryBase, lockRetryMax))
}

// wait is how long from now until what is set aside is looked at again (0: nothing is
// set aside), at least a millisecond.
func (w *lockWaits[T]) wait(now time.Time) time.Duration {
	if len(w.outs) == 0 {
		return 0
	}
	return max(w.retryAt.Sub(now), time.Millisecond)
}

// due reports whether something is set aside and it is time to look at it again.
func (w *lockWaits[T]) due(now time.Time) bool {
	return len(w.outs) > 0 && !now.Before(w.retryAt)
}

// looked notes a look at what is set aside: the next comes later, with backoff.
func (w *lockWaits[T]) looked() {
	w.tries++
	w.retryAt = time.Now().Add(backoff(w.tries, lockRetryBase, lockRetryMax))
}

// retryLocked returns, once it is time to look (see lockWaits), the outcomes set aside
// whose locks were let go, to be written in the next round, and keeps the others aside
// for another look, later.
func (r *Relay) retryLocked(ctx context.Context, w *lockWaits[outcome]) []outcome {
	if !w.due(time.Now()) {
		return nil
	}
	locked, err := r.lockedOutcomes(ctx, w.outs)
	if err != nil {
		r.failed(ctx, "record", lockLookFailed, err, "rows", len(w.outs))
		locked = nil
	} else {
		r.recovered(ctx, lockLookFailed)
	}
	var free []outcome
	if err == nil {
		free, w.outs = r.splitLocked(ctx, w.outs, locked)
	}
	w.looked()
	return free
}

// lockLookFailed is the warning of a look at the outcomes set aside that failed (see
// failed).
const lockLookFailed = "could not look whether outcomes waiting for another session's lock can be written; trying again"

// writeAround writes outs, a batch whose write waited longer than recordLockWait for a
// lock, apart from any claims: it looks which of them wait for a lock another session
// holds on a row (lockedOutcomes), writes the others, and returns those that wait as
// blocked, to be tried again later. When the others' write still waits for a lock, it
// looks again among them, as long as each look finds another row locked (a lock taken
// meanwhile). A lock no look finds is not a row's: a lock on the table (a migration's
// CREATE INDEX, LOCK TABLE), or one let go meanwhile. Split in halves down to single
// outcomes, as salvage splits, each write waited for it again, 2n-1 waits for n
// outcomes while the claim loop stood still, and each single outcome was set aside with
// a warning that another session kept a lock on its row. Such outcomes are returned as
// left, with the error, to be written again as after any failure; so are those it could
// not write for another reason. Each pass sets aside at least one outcome, or returns.
func (r *Relay) writeAround(ctx context.Context, outs []outcome) (left, blocked []outcome, err error) {
	for {
		locked, err := r.lockedOutcomes(ctx, outs)
		if err != nil {
			return outs, blocked, err
		}
		free, held := r.splitLocked(ctx, outs, locked)
		blocked = append(blocked, held...)
		if len(free) == 0 {
			return nil, blocked, nil
		}
		err = r.writeApart(ctx, free)
		if err == nil {
			return nil, blocked, nil
		}
		if !lockTimedOut(err) || len(free) == len(outs) {
			return free, blocked, err
		}
		outs = free
	}
}

// lockWait notes that the write of o waits for a lock another session holds, on row,
// and says so, once for each outcome: the operator can let the lock go.
// outboxd_database_errors_total counts it under record.
func (r *Relay) lockWait(ctx context.Context, o outcome, row int64) outcome {
	if !o.lockedSince.IsZero() {
		return o
	}
	o.lockedSince = r.cfg.NowFunc()
	r.metrics.dbErrors.WithLabelValues("record").Inc()
	args := []any{"id", o.id, "key", o.key, "attempt", o.attempt, "outcome", o.record, "waited", recordLockWait}
	if row != o.id {
		// The next row of its ordering key, which its write makes due.
		args = append(args, "locked_row", row)
	}
	r.log.WarnContext(ctx, "another database session holds a lock on this row (or on the next row of its ordering key) "+
		"and keeps it: the relay writes its other outcomes and claims without this outcome, and writes it once the lock is let go; "+
		"pg_stat_activity shows the session holding it (often idle in transaction)", args...)
	return o
}

// lockedOutcomes returns the outcomes of outs whose writes would wait for a lock another
// session holds, by the ids of their rows, each with the row locked (see
// lockedOutcomesSQL). It waits for no row lock, and for other locks (a table's) at most
// recordLockWait. A write of outs whose reply was lost may still run in the database,
// holding their rows: its session is ended first, as a write of them does (sendWrite).
func (r *Relay) lockedOutcomes(ctx context.Context, outs []outcome) (map[int64]int64, error) {
	if anyMaybeWritten(outs) {
		if err := r.fencePending(ctx); err != nil {
			return nil, err
		}
	}
	ids, ending := make([]int64, len(outs)), []int64{}
	for i, o := range outs {
		ids[i] = o.id
		if o.endsOrdered() {
			ending = append(ending, o.id)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(r.salvageTimeout, roundTimeout))
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(recordLockWaitSQL, recordLockWaitMillis)
	b.Queue(lockedOutcomesSQL, ids, ending)
	br := r.pool.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("look for locked rows: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("look for locked rows: %w", err)
	}
	locked := map[int64]int64{}
	var id, row int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &row}, func() error { locked[id] = row; return nil }); err != nil {
		return nil, fmt.Errorf("look for locked rows: %w", err)
	}
	return locked, br.Close()
}

// withoutAnswer is o without the receiver's answer, which the database refused with
// err, and with the reason in its error.
func withoutAnswer(o outcome, err error) outcome {
	msg := storableText(fmt.Sprintf("the receiver's answer could not be stored, so it was dropped: %v", err))
	if o.lastError != nil {
		msg = *o.lastError + "; " + msg
	}
	o.result, o.lastError = nil, &msg
	return o
}

// Outcomes are written in batches of up to recordBatch, since every write is a commit
// and a commit costs PostgreSQL about as much as recording a hundred rows. An outcome
// waits up to recordLinger for others, and less when a claim comes first with at least
// recordWithClaim of them; an outcome of a row with an ordering key does not wait (the
// key's next row waits for it).
//
// Fewer outcomes than recordWithClaim do not ride with a claim. At light load each
// round claims a few rows while a few outcomes wait; written in every claim's
// transaction, they made each claim slower, and a slower claim gathers more rows and
// more outcomes for the next, until the bench's latency phase (1,000 rows/s) ran rounds
// of 4-9 rows taking 5-13 ms (median) instead of 1-2 rows taking 2-3 ms, and missed its
// latency target in about half the runs. Lingering, they are written once every
// recordLinger. Under load a round gathers hundreds, and one transaction for both
// still halves the commits.
const (
	recordBatch     = 1000
	recordLinger    = 10 * time.Millisecond
	recordWithClaim = 100
)

// record writes the outcomes of a stopping relay: left, those the claim loop did not
// write, and then those in results (r.results; nil: none), in batches, until it is
// closed and drained. An outcome whose row (or its ordering key's next row) another
// session keeps locked is set aside, as the claim loop sets it aside (see writeAround),
// and looked at again with backoff until it is written or ctx ends: retried in line, it
// held up every outcome after it, those of the deliveries that ended during the stop,
// until the drain time ran out, and then they were not written at all, though nothing
// held them up.
func (r *Relay) record(ctx context.Context, left []outcome, results <-chan outcome) {
	var locked lockWaits[outcome]
	r.writeBatch(ctx, left, &locked)
	batch := make([]outcome, 0, recordBatch)
	for results != nil || len(locked.outs) > 0 {
		var (
			timer   *time.Timer
			timerCh <-chan time.Time
		)
		if wait := locked.wait(time.Now()); wait > 0 {
			timer = time.NewTimer(wait)
			timerCh = timer.C
		}
		select {
		case o, ok := <-results:
			if !ok {
				results = nil // closed: every outcome is in
				break
			}
			batch, _ = r.gather(append(batch[:0], o), false)
			r.writeBatch(ctx, batch, &locked)
		case <-timerCh:
			r.writeBatch(ctx, r.retryLocked(ctx, &locked), &locked)
		case <-ctx.Done():
			n := len(locked.outs)
			if results != nil {
				for range results { // closed by now: Run closes it before it gives up on the recorder
					n++
				}
			}
			r.log.ErrorContext(ctx, "outcomes not recorded; the rows are retried when their lease expires", "err", ctx.Err(), "rows", n)
			return
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// writeOutcomes writes batch as a stopping relay does (see record), and returns once it
// is written or ctx is done.
func (r *Relay) writeOutcomes(ctx context.Context, batch []outcome) {
	r.record(ctx, batch, nil)
}

// writeBatch writes batch, retrying with backoff until ctx is done, so an outcome is
// never dropped while there is time. Outcomes whose writes wait for a lock another
// session keeps are set aside in locked instead (see writeAround).
func (r *Relay) writeBatch(ctx context.Context, batch []outcome, locked *lockWaits[outcome]) {
	if len(batch) == 0 {
		return
	}
	args := r.recordArgs(batch)
	b := retry.WithCappedDuration(5*time.Second, retry.NewExponential(50*time.Millisecond))
	err := retry.Do(ctx, b, func(ctx context.Context) error {
		// Each try bounded, well within the drain time a stopping relay gives it (at least
		// OUTBOX_SHUTDOWN_TIMEOUT, 30 s by default): a connection that hung (no answer and
		// no reset, or an idle one a firewall forgot, which the pool pings before handing
		// it out) held the first try until the drain ended, and the outcomes were dropped
		// though the database answered on any other connection. A try cut short is
		// unsure, and the next writes again after ending its session (see sendWrite).
		ctx, cancel := context.WithTimeout(ctx, recordTryTimeout)
		defer cancel()
		if err := r.execRecord(ctx, batch, args); err != nil {
			if unsure(err) {
				markMaybeWritten(batch)
			}
			if refused(err) {
				r.log.WarnContext(ctx, "the database refused a batch of outcomes; writing it in parts", "err", err, "outcomes", len(batch))
				if batch = r.salvage(ctx, batch, err); len(batch) == 0 {
					return nil
				}
				args = r.recordArgs(batch)
			}
			if lockTimedOut(err) {
				// As the claim loop does (see writeAround): the outcomes whose rows are free
				// are written now, those that wait are set aside, and the next tries are of
				// those left for another reason.
				left, blocked, aroundErr := r.writeAround(ctx, batch)
				locked.add(blocked)
				if batch = left; len(batch) == 0 {
					return nil
				}
				args, err = r.recordArgs(batch), cmp.Or(aroundErr, err)
			}
			r.leaveReadOnly(err)
			r.failed(ctx, "record", recordFailed, err, "rows", len(batch))
			return retry.RetryableError(err)
		}
		return nil
	})
	if err == nil {
		r.written(batch)
		r.recovered(ctx, recordFailed)
	} else {
		r.log.ErrorContext(ctx, "outcomes not recorded; the rows are retried when their lease expires", "err", err, "rows", len(batch))
	}
}

// recordTryTimeout bounds each try of writeOutcomes.
const recordTryTimeout = 10 * time.Second

// queueRecord queues on b what writes batch, whose recordSQL arguments are args, and
// returns how many statements that is: recordSQL, whose first step bounds how long it
// and each statement after it wait for a row's lock (see recordLockWaitGate and
// writeAround); or, when an earlier write of some of it may have committed,
// lockAgainSQL, which does the same, and recordAgainSQL. The earlier write may also
// still be running in the database (its connection broke and the cancel was lost):
// recordAgainSQL, a statement of its own that starts once the earlier write has ended,
// then sees the attempts it logged. Then parkSQL, when batch retries rows of ordering
// keys later (queuePark), and lockNextSQL and releaseNextSQL, when it ends some
// (queueRelease); own is the instances whose rows the relay claims itself (see
// ownInstances).
func queueRecord(b *pgx.Batch, batch []outcome, args []any, own []string) int {
	n := 1
	if !anyMaybeWritten(batch) {
		b.Queue(recordSQL, args...)
	} else {
		b.Queue(lockAgainSQL, args[1], recordLockWaitMillis)
		b.Queue(recordAgainSQL, args...)
		n = 2
	}
	return n + queuePark(b, batch) + queueRelease(b, batch, own) + queueWakeEarlier(b, batch, own)
}

// queueWakeEarlier queues wakeEarlierSQL when batch holds outcomes of rows of ordering
// keys, and returns how many statements that is (0 or 1).
func queueWakeEarlier(b *pgx.Batch, batch []outcome, own []string) int {
	var ids []int64
	for _, o := range batch {
		if o.ordered {
			ids = append(ids, o.id)
		}
	}
	if len(ids) == 0 {
		return 0
	}
	b.Queue(wakeEarlierSQL, ids, own)
	return 1
}

// queuePark queues parkSQL when batch puts rows of ordering keys back to pending for a
// later retry, and returns how many statements that is (0 or 1). It runs after their
// outcomes, in the same transaction, so it sees them as written (or not written, for a
// late outcome the row no longer takes).
func queuePark(b *pgx.Batch, batch []outcome) int {
	var (
		heads []int64
		whys  []string
		at    time.Time
	)
	for _, o := range batch {
		if o.ordered && o.status == outbox.StatusPending && o.nextAt != nil {
			heads, whys = append(heads, o.id), append(whys, outbox.WaitingBehind(o.id, o.key))
			if o.finished.After(at) {
				at = o.finished
			}
		}
	}
	if len(heads) == 0 {
		return 0
	}
	b.Queue(parkSQL, heads, at, whys)
	return 1
}

// queueRelease queues lockNextSQL and releaseNextSQL when batch ends rows of ordering
// keys (delivered, dead), and returns how many statements that is (0 or 2). They run
// after their outcomes, in the same transaction, as queuePark does. lockNextSQL wakes
// the other relays for a next row of an instance not in own.
func queueRelease(b *pgx.Batch, batch []outcome, own []string) int {
	var (
		ended []int64
		at    time.Time
	)
	for _, o := range batch {
		if o.endsOrdered() {
			ended = append(ended, o.id)
			if o.finished.After(at) {
				at = o.finished
			}
		}
	}
	if len(ended) == 0 {
		return 0
	}
	b.Queue(lockNextSQL, ended, own)
	b.Queue(releaseNextSQL, ended, at)
	return 2
}

// execRecord writes batch, whose recordSQL arguments are args, in one transaction (see
// queueRecord).
func (r *Relay) execRecord(ctx context.Context, batch []outcome, args []any) error {
	b := &pgx.Batch{}
	queueRecord(b, batch, args, r.ownInstances())
	return r.sendWrite(ctx, batch, b, pgx.BatchResults.Close)
}

// anyMaybeWritten reports whether an earlier write of one of outs may have committed.
func anyMaybeWritten(outs []outcome) bool {
	return slices.ContainsFunc(outs, func(o outcome) bool { return o.maybeWritten })
}

// anyOrdered reports whether one of outs is of a row with an ordering key: writing it
// may let the key's next row go, which may lie behind where claims start.
func anyOrdered(outs []outcome) bool {
	return slices.ContainsFunc(outs, func(o outcome) bool { return o.ordered })
}

// markMaybeWritten marks outs as perhaps written already.
func markMaybeWritten(outs []outcome) {
	for i := range outs {
		outs[i].maybeWritten = true
	}
}

// lostReplyError is the error of a write whose connection is closed after it, which
// unsure takes as such whatever pgx called it: pgx reports the broken connection of a
// batch sent in the exec or simple protocol as "conn closed", which reads as never sent.
// A write whose connection was dead before it went out is taken as unsure too: what
// follows (fence, recordAgainSQL, releaseLostSQL) is right either way.
type lostReplyError struct{ err error }

func (e *lostReplyError) Error() string { return e.err.Error() }
func (e *lostReplyError) Unwrap() error { return e.err }

// lostReply wraps err as a lostReplyError unless PostgreSQL answered it.
func lostReply(err error) error {
	if errors.As(err, new(*pgconn.PgError)) {
		return err
	}
	return &lostReplyError{err}
}

// notSentError is the error of a write that failed before it went out: no connection
// could be had (the database is unreachable, or the write's context ended while it
// waited for one), or its session could not be read (see sessionOf). pgxpool reports
// the first two as errors pgconn does not call safe to retry, which unsure would take
// as a lost reply.
type notSentError struct{ err error }

func (e *notSentError) Error() string     { return e.err.Error() }
func (e *notSentError) Unwrap() error     { return e.err }
func (e *notSentError) SafeToRetry() bool { return true }

// unsure reports whether err leaves unknown whether the statement or batch committed:
// it was sent, and no answer from PostgreSQL came back (the connection broke, or the
// wait timed out). An error PostgreSQL sent means the transaction rolled back.
func unsure(err error) bool {
	if err == nil {
		return false
	}
	if errors.As(err, new(*lostReplyError)) {
		return true
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}

// recordArgs are recordSQL's arguments for batch (the last, recordLockWait, is the same
// for every batch).
func (r *Relay) recordArgs(batch []outcome) []any {
	n := len(batch)
	var (
		ids                   = make([]int64, n)
		attempts              = make([]int32, n)
		statuses, records     = make([]string, n), make([]string, n)
		nexts                 = make([]*time.Time, n)
		errs                  = make([]*string, n)
		results               = make([]*string, n) // as text: the simple protocol sends [][]byte as bytea
		ambiguous             = make([]bool, n)
		startedAt, finishedAt = make([]time.Time, n), make([]time.Time, n)
	)
	for i, o := range batch {
		ids[i], attempts[i], statuses[i], records[i] = o.id, int32(o.attempt), o.status, o.record
		nexts[i], errs[i], ambiguous[i] = o.nextAt, o.lastError, o.ambiguous
		if o.result != nil {
			res := string(o.result)
			results[i] = &res
		}
		startedAt[i], finishedAt[i] = o.started, o.finished
	}
	return []any{r.cfg.ID, ids, attempts, statuses, nexts, errs, results, ambiguous, startedAt, finishedAt, records,
		recordLockWaitMillis}
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// notify wakes a waiting loop without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
