package relay

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sethvargo/go-retry"
	"golang.org/x/time/rate"

	"github.com/outboxd/outboxd/connectors"
)

// Relay claims due rows from the outbox table, delivers them through connectors and
// records the outcomes. Any number of relays may share one database.
type Relay struct {
	pool      *pgxpool.Pool
	cfg       *Config
	log       *slog.Logger
	metrics   *metrics
	instances map[string]*instance
	names     []string // instance names, sorted
	hold      []string // forwarded instances whose ambiguous attempts are held

	wake      chan struct{} // a NOTIFY arrived, or something else worth a claim
	slotFreed chan struct{} // a claimed row finished, or was handed back
	results   chan outcome
	// claimedRows counts rows claimed and not finished (waiting for a worker or in
	// flight), at most maxClaimed; slots holds a token per delivery in flight, at most
	// Config.Concurrency.
	claimedRows atomic.Int64
	maxClaimed  int
	slots       chan struct{}
	unstartedMu sync.Mutex
	unstarted   []claimed // rows claimed ahead and not started when the relay stopped

	listening atomic.Bool
	skew      atomic.Int64 // database clock minus local clock, when NowFunc is the real clock
	probe     string       // the payload of this relay's NOTIFY self-test
	probeSeen chan struct{}
	probeOnce sync.Once
	// probeTimeout is how long the NOTIFY self-test waits; tests shorten it.
	probeTimeout time.Duration
	running      atomic.Bool
}

type instance struct {
	name      string
	conn      connectors.Connector
	guarantee connectors.Guarantee
	keyWindow time.Duration // 0: the receiver's memory of keys is not limited (or unknown)
	maxAge    time.Duration
	limit     int           // most deliveries in flight
	ahead     int           // most rows claimed ahead of a free worker
	startBy   time.Duration // a row claimed ahead that waited longer is handed back
	took      atomic.Int64  // recent attempts' average duration, in nanoseconds
	limiter   *rate.Limiter // nil: no rate limit
	claimed   atomic.Int64  // rows claimed and not finished
	jobs      chan claimed  // claimed rows waiting for one of the instance's workers

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
	connector string
	payload   json.RawMessage
	headers   map[string]string
	attempt   int
	ambiguous bool
	createdAt time.Time
	firstAt   time.Time // when the first attempt started
	claimedAt time.Time // the relay's clock at the claim; the lease runs from then
	ordered   bool      // the row has an ordering key
}

// outcome is how one attempt ended, waiting to be recorded.
type outcome struct {
	id        int64
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
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("relay metrics: %w", err)
	}
	r := &Relay{
		pool:      pool,
		cfg:       cfg,
		log:       cfg.Logger.With("component", "relay", "relay_id", cfg.ID),
		metrics:   m,
		instances: make(map[string]*instance, len(instances)),
		wake:      make(chan struct{}, 1),
		slotFreed: make(chan struct{}, 1),
		slots:     make(chan struct{}, cfg.Concurrency),
		// Room for several batches of outcomes, so a delivery frees its slot at once even
		// while a write is on its way.
		results:   make(chan outcome, 4*cfg.Concurrency),
		probe:     "probe:" + cfg.ID,
		probeSeen: make(chan struct{}),

		probeTimeout: defaultProbeTimeout,
	}
	for name, in := range instances {
		if in.Connector == nil {
			return nil, fmt.Errorf("relay: connector instance %q has no Connector", name)
		}
		if in.Concurrency < 0 || in.Rate < 0 || math.IsNaN(in.Rate) {
			return nil, fmt.Errorf("relay: connector instance %q: Concurrency and Rate must not be negative", name)
		}
		policy := cmp.Or(in.OnAmbiguous, AmbiguousRetry)
		if policy != AmbiguousRetry && policy != AmbiguousHold {
			return nil, fmt.Errorf("relay: connector instance %q: OnAmbiguous must be %q or %q, got %q", name, AmbiguousRetry, AmbiguousHold, in.OnAmbiguous)
		}
		inst := &instance{
			name:             name,
			conn:             in.Connector,
			guarantee:        in.Connector.Guarantee(),
			keyWindow:        connectors.KeyWindow(in.Connector),
			maxAge:           cmp.Or(in.MaxAge, cfg.MaxAge),
			limit:            min(cmp.Or(in.Concurrency, cfg.Concurrency), cfg.Concurrency),
			outcomes:         make(map[string]prometheus.Counter, len(outcomeLabels)),
			duration:         m.deliveryDuration.WithLabelValues(name),
			commitToDelivery: m.commitToDelivery.WithLabelValues(name),
		}
		for _, o := range outcomeLabels {
			inst.outcomes[o] = m.deliveries.WithLabelValues(name, o)
		}
		if in.MaxAge == 0 && inst.keyWindow > 0 {
			inst.maxAge = min(inst.maxAge, inst.keyWindow)
		}
		inst.ahead, inst.startBy = claimAhead(inst.limit, cfg.Lease, connectors.Timeout(in.Connector))
		inst.jobs = make(chan claimed, inst.limit+inst.ahead)
		r.maxClaimed += inst.ahead
		if in.Rate > 0 {
			inst.limiter = rate.NewLimiter(rate.Limit(in.Rate), max(1, int(in.Rate)))
		}
		if policy == AmbiguousHold && inst.guarantee == connectors.Forwarded {
			r.hold = append(r.hold, name)
		}
		r.instances[name] = inst
		r.names = append(r.names, name)
	}
	slices.Sort(r.names)
	slices.Sort(r.hold)
	r.maxClaimed = cfg.Concurrency + min(r.maxClaimed, aheadRounds*cfg.Concurrency)
	return r, nil
}

// Claiming ahead. A claim is a round trip and a commit; when it waits for free workers,
// they idle while it runs, and its batches stay small. So a relay claims up to
// aheadRounds rounds of an instance's deliveries ahead, and a worker that finishes takes
// the next row at once. A row waits only while the instance's workers are busy: the
// rows claimed ahead are cut to what the workers can start within half of startBy at the
// instance's recent pace, and one that still waited longer than startBy is handed back
// instead of sent, so its attempt ends well inside its lease. Only connectors that
// declare their time limit are claimed ahead.
const (
	aheadRounds = 3
	minStartBy  = 100 * time.Millisecond
	maxStartBy  = 5 * time.Second
)

// claimAhead returns how many rows of an instance with limit workers to claim ahead at
// most, and how long such a row may wait for a worker, for a lease and an attempt's
// time limit.
func claimAhead(limit int, lease, timeout time.Duration) (ahead int, startBy time.Duration) {
	spare := lease - timeout
	if timeout <= 0 || spare < 2*minStartBy {
		return 0, 0
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
// it is the real one, so rows stamped now() by plain SQL are due at once.
func (r *Relay) now() time.Time {
	return r.cfg.NowFunc().Add(time.Duration(r.skew.Load()))
}

// Ready reports whether the relay can work: the database answers and the LISTEN
// connection is up.
func (r *Relay) Ready(ctx context.Context) error {
	if !r.running.Load() {
		return errors.New("relay is not running")
	}
	if err := r.pool.Ping(ctx); err != nil {
		return fmt.Errorf("database unreachable: %w", err)
	}
	if !r.listening.Load() {
		return errors.New("LISTEN connection is down (reconnecting)")
	}
	return nil
}

// Run delivers rows until ctx is done. Then it stops claiming, gives in-flight deliveries
// until Config.ShutdownTimeout to finish, cancels those still running (their attempts
// are recorded as ambiguous), records every outcome, releases leases of rows it had not
// started, and returns nil. It returns an error only when it cannot start.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.start(ctx); err != nil {
		return err
	}
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

	var background sync.WaitGroup
	bgCtx, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	background.Go(func() { r.listen(bgCtx) })
	background.Go(func() { r.maintain(bgCtx) })

	// Two recorders: while one waits for its commit, the other gathers the next batch.
	var recorder sync.WaitGroup
	for range recorders {
		recorder.Go(func() { r.record(recordCtx) })
	}

	// Long-lived delivery workers, as many per instance as its limit: a claimed row
	// starts as soon as a worker is free, and a worker's stack, grown by its first
	// request, serves every later one.
	var workers sync.WaitGroup
	for _, inst := range r.instances {
		for range inst.limit {
			workers.Go(func() { r.work(ctx, deliverCtx, inst) })
		}
	}
	r.claimLoop(ctx)
	for _, inst := range r.instances {
		close(inst.jobs)
	}

	// Stopping: let in-flight deliveries finish within the shutdown timeout.
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	timer := time.NewTimer(r.cfg.ShutdownTimeout)
	select {
	case <-done:
		timer.Stop()
	case <-timer.C:
		r.log.WarnContext(ctx, "shutdown timeout reached; cancelling deliveries still in flight",
			"in_flight", len(r.slots), "timeout", r.cfg.ShutdownTimeout)
		cancelDeliveries(errors.New("relay shutdown timeout reached"))
		<-done
	}
	r.release(r.unstarted)
	close(r.results)
	// The recorder drains every outcome; give it a bounded time when the database is down.
	recDone := make(chan struct{})
	go func() { recorder.Wait(); close(recDone) }()
	select {
	case <-recDone:
	case <-time.After(max(r.cfg.ShutdownTimeout, minRecordDrain)):
		r.log.ErrorContext(ctx, "could not record every outcome before exit; those rows stay leased and are retried after their lease expires")
		cancelRecords()
		<-recDone
	}
	stopBackground()
	background.Wait()
	r.log.InfoContext(ctx, "relay stopped")
	return nil
}

// minRecordDrain is the least time a stopping relay gives its last outcomes to reach a
// slow database: an outcome not recorded means a second attempt after the lease expires.
const minRecordDrain = 5 * time.Second

// start pings the database (the pool connects lazily), retrying briefly so that a relay
// started alongside its database waits for it, and measures clock skew.
func (r *Relay) start(ctx context.Context) error {
	b := retry.WithMaxDuration(30*time.Second, retry.WithCappedDuration(2*time.Second, retry.NewExponential(100*time.Millisecond)))
	var dbNow time.Time
	err := retry.Do(ctx, b, func(ctx context.Context) error {
		before := time.Now()
		if err := r.pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
			return retry.RetryableError(err)
		}
		if r.cfg.usesRealClock {
			r.skew.Store(int64(dbNow.Sub(before.Add(time.Since(before) / 2))))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("relay: reach database: %w", err)
	}
	return nil
}

// Fast polling. A relay that claimed rows within the last fastPollWindow looks for more
// every fastPollInterval, and says so in outbox_wake; while it does, the insert trigger
// sends no NOTIFY. PostgreSQL serialises the commits of all transactions that NOTIFY,
// so under steady load the notifications would cap the application's commit rate; when
// the load stops, polling_until lapses and inserts wake idle relays with NOTIFY again.
const (
	fastPollInterval = 2 * time.Millisecond
	fastPollWindow   = 2 * time.Second
	fastPollRefresh  = fastPollWindow / 4
)

// claimLoop claims rows and hands them to the delivery workers until ctx is done.
func (r *Relay) claimLoop(ctx context.Context) {
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	var (
		failures    int
		fastUntil   time.Time // this relay polls fast until then (monotonic clock)
		lastRefresh time.Time
	)
	for ctx.Err() == nil {
		claimed, more, retryIn, err := r.claimRound(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			r.metrics.dbErrors.WithLabelValues("claim").Inc()
			wait := backoff(failures, 100*time.Millisecond, 5*time.Second)
			r.log.WarnContext(ctx, "claim failed; retrying", "err", err, "retry_in", wait)
			sleep(ctx, wait)
			continue
		}
		failures = 0
		if claimed > 0 && time.Since(lastRefresh) >= fastPollRefresh {
			if _, err := r.pool.Exec(ctx, pollFastSQL, fastPollWindow); err == nil {
				lastRefresh = time.Now()
				fastUntil = lastRefresh.Add(fastPollWindow)
			}
		}
		if more {
			continue
		}
		if time.Now().Before(fastUntil) && (retryIn == 0 || retryIn > fastPollInterval) {
			retryIn = fastPollInterval
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
		case <-timerCh:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// claimRound claims for every instance as much as its room and rate allow, and returns
// how many rows it claimed. more is true when some claim came back full (there may be
// more due rows); retryIn is when a rate-limited instance will next have a token.
func (r *Relay) claimRound(ctx context.Context) (claimed int, more bool, retryIn time.Duration, err error) {
	room := r.maxClaimed - int(r.claimedRows.Load())
	// Under load, wait for a quarter of the room before claiming, so claims stay batches.
	if room < max(1, r.maxClaimed/4) {
		return 0, false, 0, nil
	}
	for _, name := range r.names {
		inst := r.instances[name]
		limit := min(r.cfg.BatchSize, room, inst.room())
		if inst.limiter != nil {
			now := time.Now()
			tokens := int(inst.limiter.TokensAt(now))
			if tokens < 1 {
				wait := time.Duration(float64(time.Second) * (1 - inst.limiter.TokensAt(now)) / float64(inst.limiter.Limit()))
				if retryIn == 0 || wait < retryIn {
					retryIn = max(wait, time.Millisecond)
				}
				continue
			}
			limit = min(limit, tokens)
		}
		if limit <= 0 {
			continue
		}
		rows, err := r.claim(ctx, name, limit)
		if err != nil {
			return claimed, false, 0, fmt.Errorf("claim %s: %w", name, err)
		}
		claimed += len(rows)
		if inst.limiter != nil && len(rows) > 0 {
			inst.limiter.AllowN(time.Now(), len(rows))
		}
		r.metrics.claimBatch.Observe(float64(len(rows)))
		if ctx.Err() != nil {
			// Stopping between the claim and the start: hand the rows back.
			r.release(rows)
			return claimed, false, 0, nil
		}
		// Never blocks: an instance's claimed rows never exceed its channel's capacity.
		r.claimedRows.Add(int64(len(rows)))
		inst.claimed.Add(int64(len(rows)))
		for _, row := range rows {
			inst.jobs <- row
		}
		room -= len(rows)
		if len(rows) == limit {
			more = true
		}
	}
	return claimed, more, retryIn, nil
}

// claim runs claimSQL for one instance.
func (r *Relay) claim(ctx context.Context, name string, limit int) ([]claimed, error) {
	now := r.now()
	rows, err := r.pool.Query(ctx, claimSQL, name, now, limit, r.cfg.ID, now.Add(r.cfg.Lease))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var (
			c       claimed
			payload []byte // []byte takes jsonb's text as is; json.RawMessage would go through json.Unmarshal
			headers []byte
		)
		if err := row.Scan(&c.id, &c.key, &c.connector, &payload, &headers, &c.attempt, &c.ambiguous, &c.createdAt, &c.firstAt, &c.ordered); err != nil {
			return c, err
		}
		c.payload, c.claimedAt = payload, now
		// Most rows carry no headers ('{}'); decode only those that do.
		if len(headers) > 2 {
			if err := json.Unmarshal(headers, &c.headers); err != nil {
				return c, fmt.Errorf("row %d headers: %w", c.id, err)
			}
		}
		return c, nil
	})
}

// release hands back rows claimed but not started. If it fails, their leases expire.
func (r *Relay) release(rows []claimed) {
	if len(rows) == 0 {
		return
	}
	ids := make([]int64, len(rows))
	for i, row := range rows {
		ids[i] = row.id
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.pool.Exec(ctx, releaseSQL, r.cfg.ID, ids, r.now()); err != nil {
		r.log.WarnContext(ctx, "could not release unstarted rows; they are retried when their lease expires", "err", err, "rows", len(ids))
		return
	}
	r.log.InfoContext(ctx, "released rows not started", "rows", len(ids))
}

// work is one of inst's delivery workers: it takes the instance's claimed rows and
// delivers each once a slot is free, until the relay stops (ctx is done) and the rows
// run out. Rows it has not started by then are kept for release, and so is a row that
// waited longer than inst.startBy.
func (r *Relay) work(ctx, deliverCtx context.Context, inst *instance) {
	for row := range inst.jobs {
		started := false
		if ctx.Err() == nil && (inst.startBy == 0 || r.now().Sub(row.claimedAt) <= inst.startBy) {
			r.slots <- struct{}{}
			if started = ctx.Err() == nil; started {
				r.deliver(deliverCtx, inst, row)
			}
			<-r.slots
		}
		if !started {
			r.handBack(ctx, inst, row)
		}
		inst.claimed.Add(-1)
		r.claimedRows.Add(-1)
		notify(r.slotFreed)
	}
}

// handBack gives up a claimed row without an attempt: when the relay is stopping, it is
// released with the others at the end of Run; otherwise (it waited too long for a
// worker) it is released at once.
func (r *Relay) handBack(ctx context.Context, inst *instance, row claimed) {
	if ctx.Err() != nil {
		r.unstartedMu.Lock()
		r.unstarted = append(r.unstarted, row)
		r.unstartedMu.Unlock()
		return
	}
	r.metrics.handedBack.Inc()
	r.log.WarnContext(ctx, "a claimed row waited too long for a free worker; handing it back",
		"connector", inst.name, "id", row.id, "waited", r.now().Sub(row.claimedAt).Round(time.Millisecond), "limit", inst.startBy)
	r.release([]claimed{row})
}

// deliver makes one attempt and queues its outcome.
func (r *Relay) deliver(ctx context.Context, inst *instance, row claimed) {
	started := r.now()
	if inst.forgotten(row, started) {
		// Not sent: the receiver no longer knows the key (see decide).
		r.results <- r.holdForgotten(inst, row, started)
		return
	}
	result, err := safeDeliver(ctx, inst.conn, connectors.Delivery{
		Key: row.key, Attempt: row.attempt, Payload: row.payload, Headers: row.headers, PreviousAmbiguous: row.ambiguous,
	})
	finished := r.now()
	if err != nil && ctx.Err() != nil {
		// Cancelled at the shutdown timeout: the request may have been sent.
		err = connectors.Ambiguous(fmt.Errorf("%w (cancelled: %v)", err, context.Cause(ctx)))
	}
	o := r.decide(inst, row, result, err, finished)
	o.started = started
	inst.observe(o.record, finished.Sub(started), finished.Sub(row.createdAt))
	inst.observeTook(finished.Sub(started))
	r.results <- o
}

// forgotten reports whether an attempt of row at t would reach an enforcing receiver
// after it has forgotten the row's key: the retry would be a blind duplicate.
func (inst *instance) forgotten(row claimed, t time.Time) bool {
	return inst.keyWindow > 0 && inst.guarantee == connectors.Enforced && !row.firstAt.IsZero() &&
		t.After(row.firstAt.Add(inst.keyWindow))
}

func forgottenReason(inst *instance, row claimed) string {
	return fmt.Sprintf("held: %s remembers idempotency keys for %s and the first attempt was at %s, so a retry now could act twice; "+
		"check the receiver, then replay with a new key or cancel", inst.name, inst.keyWindow, row.firstAt.UTC().Format(time.RFC3339))
}

// holdForgotten is the outcome of an attempt not made because the key window passed.
func (r *Relay) holdForgotten(inst *instance, row claimed, now time.Time) outcome {
	msg := fmt.Sprintf("attempt %d not sent: %s", row.attempt, forgottenReason(inst, row))
	inst.observe(statusHeld, 0, 0)
	return outcome{id: row.id, attempt: row.attempt, status: statusHeld, lastError: &msg,
		started: now, finished: now, record: statusHeld, ordered: row.ordered}
}

// safeDeliver turns a connector's panic into a retryable error.
func safeDeliver(ctx context.Context, c connectors.Connector, d connectors.Delivery) (res json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("connector panicked: %v", p)
		}
	}()
	return c.Deliver(ctx, d)
}

const (
	statusPending   = "pending"
	statusDelivered = "delivered"
	statusDead      = "dead"
	statusHeld      = "held"
)

// decide turns an attempt's result into the row's next state.
func (r *Relay) decide(inst *instance, row claimed, result json.RawMessage, err error, now time.Time) outcome {
	o := outcome{id: row.id, attempt: row.attempt, finished: now, ordered: row.ordered}
	if len(result) > 0 && json.Valid(result) {
		o.result = result
	}
	if err == nil {
		o.status, o.record = statusDelivered, statusDelivered
		return o
	}
	o.ambiguous = connectors.IsAmbiguous(err)
	msg := fmt.Sprintf("attempt %d: %v", row.attempt, err)
	switch {
	case connectors.IsPermanent(err):
		o.status = statusDead
		msg += " (permanent: not retried)"
	case o.ambiguous && slices.Contains(r.hold, inst.name):
		o.status = statusHeld
		msg += " (the receiver does not enforce the key, so the row is held: replay or cancel it)"
	case row.attempt >= r.cfg.MaxAttempts:
		o.status = statusDead
		msg += fmt.Sprintf(" (gave up after %d attempts)", row.attempt)
	default:
		delay, hasDelay := connectors.RetryDelay(err)
		next := nextAttemptAt(now, row.attempt, delay, hasDelay, r.cfg.BackoffBase, r.cfg.BackoffMax)
		if deadline := row.createdAt.Add(inst.maxAge); next.After(deadline) {
			o.status = statusDead
			msg += fmt.Sprintf(" (gave up: the next attempt at %s would be later than the maximum age %s)",
				next.UTC().Format(time.RFC3339), inst.maxAge)
		} else if inst.forgotten(row, next) {
			o.status = statusHeld
			msg += " (" + forgottenReason(inst, row) + ")"
		} else {
			o.status = statusPending
			o.nextAt = &next
			msg += fmt.Sprintf(" (retrying at %s)", next.UTC().Format(time.RFC3339))
		}
	}
	o.lastError = &msg
	o.record = o.status
	if o.status == statusPending {
		o.record = "retry"
	}
	return o
}

// recorders is how many goroutines write outcomes.
const recorders = 2

// Outcomes are written in batches of up to recordBatch. A recorder that has some waits
// up to recordLinger for more, since every write is a commit, and a commit costs
// PostgreSQL about as much as recording a hundred rows; it writes at once when the batch
// is full or holds the outcome of a row with an ordering key (the key's next row waits
// for it).
const (
	recordBatch  = 1000
	recordLinger = 10 * time.Millisecond
)

// record writes outcomes in batches until r.results is closed and drained. A failed
// write is retried with backoff, so an outcome is never dropped while the relay runs.
func (r *Relay) record(ctx context.Context) {
	batch := make([]outcome, 0, recordBatch)
	linger := time.NewTimer(recordLinger)
	linger.Stop()
	for o := range r.results {
		batch = append(batch[:0], o)
		urgent := o.ordered
		linger.Reset(recordLinger)
	gather:
		for len(batch) < recordBatch && !urgent {
			select {
			case o, ok := <-r.results:
				if !ok {
					break gather
				}
				batch = append(batch, o)
				urgent = o.ordered
			case <-linger.C:
				break gather
			}
		}
		linger.Stop()
		r.writeOutcomes(ctx, batch)
	}
}

func (r *Relay) writeOutcomes(ctx context.Context, batch []outcome) {
	n := len(batch)
	var (
		ids                   = make([]int64, n)
		attempts              = make([]int32, n)
		statuses, records     = make([]string, n), make([]string, n)
		nexts                 = make([]*time.Time, n)
		errs                  = make([]*string, n)
		results               = make([][]byte, n)
		ambiguous             = make([]bool, n)
		startedAt, finishedAt = make([]time.Time, n), make([]time.Time, n)
	)
	for i, o := range batch {
		ids[i], attempts[i], statuses[i], records[i] = o.id, int32(o.attempt), o.status, o.record
		nexts[i], errs[i], results[i], ambiguous[i] = o.nextAt, o.lastError, o.result, o.ambiguous
		startedAt[i], finishedAt[i] = o.started, o.finished
	}
	b := retry.WithCappedDuration(5*time.Second, retry.NewExponential(50*time.Millisecond))
	err := retry.Do(ctx, b, func(ctx context.Context) error {
		_, err := r.pool.Exec(ctx, recordSQL, r.cfg.ID, ids, attempts, statuses, nexts, errs, results,
			ambiguous, startedAt, finishedAt, records)
		if err != nil {
			r.metrics.dbErrors.WithLabelValues("record").Inc()
			r.log.WarnContext(ctx, "recording outcomes failed; retrying", "err", err, "rows", n)
			return retry.RetryableError(err)
		}
		return nil
	})
	if err != nil {
		r.log.ErrorContext(ctx, "outcomes not recorded; the rows are retried when their lease expires", "err", err, "rows", n)
	}
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
