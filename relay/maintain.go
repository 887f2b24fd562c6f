package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/outbox"
)

// Intervals of the background work.
const (
	// reclaimInterval is the longest time between two reclaims (and readings of the
	// database's clock, see readClock), which otherwise run every poll interval. An
	// operator who raised OUTBOX_POLL_INTERVAL because NOTIFY works (to a minute, say)
	// delayed by as much the return of a dead relay's rows beyond their lease, and left
	// a clock that stepped uncorrected as long, while the leases this relay writes, and
	// those it takes for expired, need it right within the second that serve keeps
	// between a connector's timeout and OUTBOX_LEASE. Five seconds is a sixth of the
	// default lease, and a reclaim that finds nothing is a reading of the clock and one
	// probe of outbox_delivering_lease, here made a fifth as often as at the default
	// poll interval.
	reclaimInterval   = 5 * time.Second
	statsInterval     = 10 * time.Second
	retentionInterval = time.Minute
	retentionBatch    = 1000
)

// The warnings of the periodic work that say the same at every failure (see failed;
// the parking passes' name what they park behind).
const (
	seenFailed      = "could not renew this relay's connector instances for the insert trigger; trying again soon"
	clockFailed     = "reading the database's clock failed; reclaiming expired leases at the next pass"
	reclaimFailed   = "reclaiming expired leases failed; trying again at the next pass"
	statsFailed     = "reading row statistics failed"
	retentionFailed = "deleting rows past retention failed; trying again later"
)

// maintain runs the periodic work: put back rows whose lease expired, refresh the gauges,
// report rows for unknown connectors, renew the word that this relay runs (see seen),
// park the rows behind rows that wait for an operator (see parkWaiting) or that this
// relay has in flight (see parkInFlight), and delete rows past retention.
func (r *Relay) maintain(ctx context.Context) {
	// Retention runs on its own: a backlog of rows past retention (retention turned on
	// or shortened on a large table) takes many batches, and reclaiming expired leases
	// must not wait for them.
	var retention sync.WaitGroup
	started := make(chan struct{})
	retention.Go(func() { r.retain(ctx, started) })
	defer retention.Wait()
	// Reclaim every poll interval, and at least every reclaimAtMost (see
	// reclaimInterval); the parking passes behind rows in flight every poll interval.
	reclaim := time.NewTicker(min(r.cfg.PollInterval, r.reclaimAtMost))
	defer reclaim.Stop()
	park := time.NewTicker(r.cfg.PollInterval)
	defer park.Stop()
	stats := time.NewTicker(statsInterval)
	defer stats.Stop()

	r.bounded(ctx, r.seen)
	r.bounded(ctx, r.reclaim)
	r.bounded(ctx, r.refreshStats)
	r.bounded(ctx, r.parkWaiting)
	close(started)
	for {
		select {
		case <-ctx.Done():
			return
		case <-reclaim.C:
			r.bounded(ctx, r.reclaim)
		case <-park.C:
			r.bounded(ctx, r.parkInFlight)
		case <-stats.C:
			r.bounded(ctx, r.seen)
			r.bounded(ctx, r.refreshStats)
			r.bounded(ctx, r.parkWaiting)
		}
	}
}

// maintainTimeout bounds each piece of the periodic work (and each batch of retention).
// A connection that hangs (packets dropped without a reset: a partition, a firewall that
// forgot the connection) answers nothing until the kernel gives up retransmitting, a
// quarter of an hour, and the work waiting on it held the others: reclaim, and with it
// the rows of relays that died, and the claim loop too while reclaim handed back rows
// (see releaseAgain). Cut short, the work fails, its connection is closed, and the next
// run takes another.
const maintainTimeout = 30 * time.Second

// errMaintainTimeout is the cause of a context that maintainTimeout ended, which tells
// that failure from the relay stopping (see stopping).
var errMaintainTimeout = errors.New("the relay's periodic work took longer than its bound")

// bounded runs f with ctx bounded by the relay's maintainTimeout.
func (r *Relay) bounded(ctx context.Context, f func(context.Context)) {
	ctx, cancel := context.WithTimeoutCause(ctx, r.maintainTimeout, errMaintainTimeout)
	defer cancel()
	f(ctx)
}

// stopping reports whether ctx ended because the relay stops, rather than by a bound
// (see bounded): a failure is reported unless the relay stops.
func stopping(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), errMaintainTimeout)
}

// retain deletes rows past retention once the relay's first periodic work is done
// (started is closed), and then every retentionInterval until ctx ends. The first pass
// came only a retentionInterval after start, and a relay restarted more often than that
// (a crash loop, a short-lived job that embeds it) never deleted a row. It waits for the
// first reclaim and refresh, which put back the rows of relays that died and say what
// waits, and runs beside the claim loop, on a connection of its own, in batches of
// retentionBatch: readiness and the first claims wait for none of it.
func (r *Relay) retain(ctx context.Context, started <-chan struct{}) {
	select {
	case <-ctx.Done():
		return
	case <-started:
	}
	r.deleteExpired(ctx)
	tick := time.NewTicker(r.retentionEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.deleteExpired(ctx)
		}
	}
}

// seen renews, in outbox_wake_connectors, this relay's word that it runs with its
// connector instances, for seenFor, every statsInterval: the insert trigger then sends
// NOTIFY while no relay polls fast for one of them (another relay may be busy with other
// instances). A relay that stops deletes its words (see withdraw); one that dies leaves
// them to lapse, and meanwhile inserts only send NOTIFY no relay needed.
//
// It also looks for another relay running with the same ID, which this relay's words
// tell: one was written since its last renewal, or withdrawn, and not by this relay. Two
// relays with one ID withdraw each other's words when one stops (inserts then may not
// wake the other), a release of a round whose reply was lost hands back the other's rows
// in flight when their leases end in the same microsecond, and the attempts log cannot
// tell them apart: each renewal that finds one reports it.
//
// A relay whose renewals did not run for longer than seenGoneAfter (its process paused
// or stopped with SIGSTOP, its machine or VM suspended) finds its words gone for another
// reason: any relay's renewal deletes words lapsed that long as a dead relay's. That
// said "another relay uses this ID" on every resume after an hour away. Words that are
// missing, or older than this relay's last renewal (the claim loop wrote them again, with
// no seen_until, before this renewal ran), after such a lapse are not taken for another
// relay; words renewed since this relay's last renewal still are, however long it was
// away. A withdrawal by another relay with the ID while this one was away goes unsaid:
// that relay has stopped, and one that runs on is found by its next renewal.
func (r *Relay) seen(ctx context.Context) {
	if r.withdrawn.Load() {
		return // the relay is stopping (see withdraw)
	}
	var before, after, now pgtype.Timestamptz
	err := r.pool.QueryRow(ctx, seenSQL, r.cfg.ID, nonNil(r.names), seenFor, seenGoneAfter).Scan(&before, &after, &now)
	if r.withdrawn.Load() {
		// withdraw began while this ran, and its delete may have come first.
		r.withdraw(ctx)
		return
	}
	if err != nil {
		// The renewal may have committed without its reply: the next one compares with
		// nothing.
		r.lastSeen = pgtype.Timestamptz{}
		if !stopping(ctx) {
			r.failed(ctx, "seen", seenFailed, err)
		}
		return
	}
	r.recovered(ctx, seenFailed)
	// How long the last word had lapsed, by the database's clock, which is the one that
	// wrote it and that every renewal deletes lapsed words by: the relay's own clock may
	// have stood still while its machine slept.
	var lapsed time.Duration
	if r.lastSeen.Valid && now.Valid {
		lapsed = now.Time.Sub(r.lastSeen.Time)
	}
	gone := lapsed > seenGoneAfter && (!before.Valid || before.InfinityModifier == pgtype.NegativeInfinity ||
		(before.InfinityModifier == pgtype.Finite && before.Time.Before(r.lastSeen.Time)))
	if r.lastSeen.Valid && !sameTime(before, r.lastSeen) && !gone {
		r.log.ErrorContext(ctx, "ANOTHER RELAY USES THIS RELAY'S ID: its word in outbox_wake_connectors was renewed or withdrawn "+
			"by another relay since this one last renewed it; relays sharing one ID withdraw each other's words when one stops, "+
			"may hand back each other's rows in flight, and cannot be told apart in the attempts log: give each relay its own "+
			"OUTBOX_RELAY_ID, or leave it unset for a generated one")
	}
	if lapsed > 0 {
		r.log.WarnContext(ctx, "this relay's periodic work did not run for longer than its word in outbox_wake_connectors "+
			"lasts (the process was paused or stopped, its machine suspended, or the work held up by a slow database): "+
			"inserts meanwhile may not have woken it, and other relays may have put back, as ambiguous attempts, rows it "+
			"held whose leases expired; it now looks for due rows from the head of the index",
			"unrenewed_for", (lapsed + seenFor).Round(time.Second))
	}
	if !r.lastSeen.Valid || lapsed > 0 {
		// The first word since the relay started, since a renewal failed (the word may
		// have lapsed), or since one that lapsed: rows inserted before it committed may
		// have sent no NOTIFY, while another relay polled fast for its own instances.
		// Look for them from the head.
		r.rescan.Store(true)
		notify(r.wake)
	}
	r.lastSeen = after
}

// sameTime reports whether a and b are the same timestamp, or both NULL.
func sameTime(a, b pgtype.Timestamptz) bool {
	return a.Valid == b.Valid && a.InfinityModifier == b.InfinityModifier && a.Time.Equal(b.Time)
}

// seenFor is how long the word seen renews lasts: several renewals, so that one that
// fails now and then does not let it lapse.
const seenFor = 6 * statsInterval

// seenGoneAfter is how long words in outbox_wake_connectors (of both kinds: seen and
// polling fast) must have lapsed for a renewal to delete them as a dead relay's (see
// seenSQL).
const seenGoneAfter = time.Hour

// reclaim puts back rows whose lease expired, by the database's clock as just read, and
// wakes the claim loop when it did, with its next claims starting at the head of the
// index.
func (r *Relay) reclaim(ctx context.Context) {
	// On the database's clock as it is now, not as it was at start (see readClock).
	if r.cfg.usesRealClock {
		if err := r.readClock(ctx); err != nil {
			if !stopping(ctx) {
				r.failed(ctx, "reclaim", clockFailed, err)
			}
			return
		}
		r.recovered(ctx, clockFailed)
	}
	// This relay's own rows whose release failed were never sent: hand them back first,
	// rather than putting them back below as abandoned, ambiguous attempts.
	if r.anyUnreleased.Load() {
		r.releaseAgain(ctx)
	}
	// Looked at under releasingMu, so that a hand-back under way (its rows taken off the
	// lists) is waited for. Not held across the statements below: the claim loop takes
	// it before its rounds whenever it has rows to hand back, and a reclaim whose
	// connection hangs (packets dropped without a reset) held it, and so stopped the
	// loop's outcomes and claims, for as long as the kernel retransmitted. Rows put on
	// the lists meanwhile are of claims too recent for their leases to have expired.
	r.releasingMu.Lock()
	unreleased := r.anyUnreleased.Load()
	r.releasingMu.Unlock()
	if unreleased {
		return // the database is still away, or a release failed again: not now
	}
	now := r.now()
	var (
		put        []int64
		nextLocked bool // a key's next row was locked: put back without letting them go
		// The rows of each status, the first reclaimNamed of them by id with their keys.
		statuses map[string]*reclaimedRows
	)
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, reclaimSQL, now, r.cfg.MaxAttempts, nonNil(r.hold), nonNil(r.names), r.maxAges,
			r.cfg.ID, r.leftAlone(now))
		if err != nil {
			return err
		}
		put, statuses, nextLocked = put[:0], map[string]*reclaimedRows{}, false // a retried transaction starts again
		var (
			id          int64
			key, status string
		)
		if _, err = pgx.ForEachRow(rows, []any{&id, &key, &status}, func() error {
			put = append(put, id)
			if statuses[status] == nil {
				statuses[status] = &reclaimedRows{}
			}
			statuses[status].add(id, key, status)
			return nil
		}); err != nil || len(put) == 0 {
			return err
		}
		// Rows sent to dead let their keys' next rows go: those may be parked behind
		// them (parkInFlight), by a relay that is gone and will not write their outcome.
		// In a savepoint, waiting at most recordLockWait for a lock (lockNextSQL waits for
		// the next rows, which parking passes and operators' decisions hold for
		// milliseconds): a lock another session keeps on one (a psql BEGIN; SELECT ...
		// FOR UPDATE left open) held the reclaim until maintainTimeout cut it short and
		// rolled it back, and every pass after it, so that no expired lease was put back
		// while it was kept. Then the rows are put back without letting the next rows go:
		// one parked behind goes when its parking ends (parkFor), as it would have with
		// its relay alive; the one locked is claimed by no relay until it is let go.
		err = pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, recordLockWaitSQL, recordLockWaitMillis); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, lockNextSQL, put, r.ownInstances()); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, releaseNextSQL, put, now)
			return err
		})
		if lockTimedOut(err) {
			nextLocked, err = true, nil
		}
		return err
	})
	if err != nil {
		if !stopping(ctx) {
			r.failed(ctx, "reclaim", reclaimFailed, err)
		}
		return
	}
	r.recovered(ctx, reclaimFailed)
	if nextLocked {
		r.metrics.dbErrors.WithLabelValues("reclaim").Inc()
		r.log.WarnContext(ctx, "another database session keeps locked the next row of an ordering key whose row in flight "+
			"was sent to dead when its relay's lease expired: the rows were put back, and the keys' next rows parked behind "+
			"them go when their parking ends, within a minute; pg_stat_activity shows the session holding it (often idle in "+
			"transaction)", "rows", len(put))
	}
	if n := len(put); n > 0 {
		r.metrics.leaseExpiries.Add(float64(n))
		// Each warning names the first of its rows, by id and key, so that an operator
		// can look them up with the receiver; counts alone left no way to find them.
		if pending := statuses[statusPending]; pending != nil {
			r.log.WarnContext(ctx, "rows put back after their relay's lease expired; their last attempt is recorded as ambiguous "+
				"(the receiver may or may not have acted, outboxd inspect shows the attempts)",
				"rows", pending.count, "first_rows", pending.named, "more_rows", pending.count-len(pending.named))
		}
		// Not retried: these wait for a person, who must know the receiver may have
		// acted. Said of them as "put back", they were taken for rows to be retried.
		held, dead := cmp.Or(statuses[statusHeld], &reclaimedRows{}), cmp.Or(statuses[statusDead], &reclaimedRows{})
		if held.count+dead.count > 0 {
			named := slices.Concat(held.named, dead.named)
			slices.SortFunc(named, func(a, b reclaimedRow) int { return cmp.Compare(a.ID, b.ID) })
			named = named[:min(len(named), reclaimNamed)]
			r.log.WarnContext(ctx, "rows whose relay's lease expired mid-attempt were held (the hold policy) or sent to dead "+
				"(their last allowed attempt, or past their maximum age); the receiver may or may not have acted: "+
				"check it (outboxd inspect shows the attempts), then replay or cancel them", "held", held.count, "dead", dead.count,
				"first_rows", named, "more_rows", held.count+dead.count-len(named))
		}
		// A row sent to dead lets the next row of its ordering key go, which may lie
		// behind where claims start.
		r.rescan.Store(true)
		notify(r.wake)
	}
}

// reclaimNamed is the most rows a warning of reclaim names, the first by id: enough to
// start looking with the receiver, while a reclaim of a thousand rows (a relay that died
// with a full batch in flight) stays one line of reasonable length.
const reclaimNamed = 10

// reclaimedRows are the rows reclaim took with one new status: how many, and the first
// reclaimNamed of them by id (reclaimSQL returns them in id order).
type reclaimedRows struct {
	count int
	named []reclaimedRow
}

// reclaimedRow is a row reclaim took, as its warnings name it.
type reclaimedRow struct {
	ID     int64  `json:"id"`
	Key    string `json:"key"`
	Status string `json:"status"`
}

// String is the row as a text log shows it, its key quoted: a key may hold spaces, and
// unquoted it could not be told from the fields around it.
func (row reclaimedRow) String() string {
	return fmt.Sprintf("{id=%d key=%q status=%s}", row.ID, row.Key, row.Status)
}

// add counts a row, and names it while fewer than reclaimNamed are.
func (rs *reclaimedRows) add(id int64, key, status string) {
	rs.count++
	if len(rs.named) < reclaimNamed {
		rs.named = append(rs.named, reclaimedRow{ID: id, Key: key, Status: status})
	}
}

const (
	// parkFor is how long a row parked behind a row that waits (for an operator, or in
	// flight) stays parked before it is due again (see parkWaitingSQL): how late it may
	// go after that row ends other than by an operator's decision through package ops or
	// an outcome this relay writes.
	parkFor = time.Minute
	// waitingHeads is the most rows waiting for an operator, or in flight, one pass
	// parks behind.
	waitingHeads = 10000
	// parkBehindMin is the fewest rows of its key not finished behind a row in flight
	// for the rows behind it to be parked. Parking and releasing a row writes it twice,
	// some 60 µs of PostgreSQL's CPU here, and a claim reads a row waiting behind a row
	// in flight only when it has not found enough rows due before it: with 2,000 keys
	// of 10 rows each, parking behind every row in flight made the relay slower (with
	// the release statements, then planned over the whole table, by a third:
	// BenchmarkManyKeysBacklog), while a key's backlog of thousands is read by every
	// claim until it is parked.
	parkBehindMin = 50
)

// A parkPass is one kind of parking pass (see parkWaitingSQL): behind rows that wait
// for an operator, every statsInterval, or behind this relay's rows in flight, every
// poll interval.
type parkPass struct {
	what     string   // the rows parked behind, for the log
	heads    string   // the query for the rows to park behind: their ids and keys
	statuses []string // the statuses in which they wait
	why      func(id int64, key string) string
	every    time.Duration // how often the pass runs
}

var (
	waitingPass = parkPass{
		what:     "rows that wait for an operator",
		heads:    waitingHeadsSQL,
		statuses: []string{outbox.StatusHeld, outbox.StatusAwaitingApproval},
		why:      outbox.WaitingForOperator,
		every:    statsInterval,
	}
	inFlightPass = parkPass{
		what:     "rows in flight",
		heads:    inFlightHeadsSQL,
		statuses: []string{outbox.StatusDelivering},
		why:      outbox.WaitingForDelivery,
	}
)

// parkWaiting parks the rows waiting behind rows held or awaiting approval (see
// parkWaitingSQL), every statsInterval.
func (r *Relay) parkWaiting(ctx context.Context) {
	r.park(ctx, waitingPass, waitingHeads)
}

// parkInFlight parks the rows waiting behind this relay's rows of ordering keys in
// flight (see inFlightHeadsSQL), every poll interval, when it has claimed any since the
// last pass or holds some. Not only when it holds some: a row finished (done) is in
// flight until the round that writes its outcome commits, which also claims the key's
// next row, and while that is slow (rows behind it not parked yet) a relay working off
// one key's backlog held none for most of the time.
func (r *Relay) parkInFlight(ctx context.Context) {
	claims := r.orderedClaims.Load()
	if r.orderedClaimsParked.Swap(claims) == claims && r.claimedOrdered.Load() == 0 {
		return
	}
	p := inFlightPass
	p.every = r.cfg.PollInterval
	if !r.park(ctx, p, r.cfg.ID, waitingHeads, r.parkBehindMin-1) {
		// Nothing was parked behind those claims: the next pass runs, whatever the relay
		// holds then, as the other passes run again after a failure (and it ends the run
		// of failures, see recovered).
		r.orderedClaimsParked.CompareAndSwap(claims, -1)
	}
}

// park runs pass p, whose heads query takes args, and reports whether it did.
func (r *Relay) park(ctx context.Context, p parkPass, args ...any) bool {
	msg := "parking rows behind " + p.what + " failed; trying again later"
	fail := func(err error) {
		if !stopping(ctx) {
			r.failed(ctx, "park", msg, err)
		}
	}
	rows, err := r.pool.Query(ctx, p.heads, args...)
	if err != nil {
		fail(err)
		return false
	}
	type head struct {
		ID  int64
		Key string
	}
	found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[head])
	if err != nil {
		fail(err)
		return false
	}
	if len(found) == 0 {
		r.recovered(ctx, msg)
		return true
	}
	heads, whys := make([]int64, len(found)), make([]string, len(found))
	for i, h := range found {
		heads[i], whys[i] = h.ID, p.why(h.ID, h.Key)
	}
	now := r.now()
	next := now.Add(p.every)
	// Two statements, the second with a snapshot taken once the first holds the rows
	// (see lockWaitingSQL).
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, lockWaitingSQL, heads, now, next, p.statuses)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(ids) == 0 {
			return err
		}
		// Parked for parkFor, or two passes when they come less often (a long poll
		// interval), so that a pass renews them before they are due.
		_, err = tx.Exec(ctx, parkWaitingSQL, heads, now, next, p.statuses, whys, now.Add(max(parkFor, 2*p.every)), ids)
		return err
	})
	if err != nil {
		fail(err)
		return false
	}
	r.recovered(ctx, msg)
	return true
}

// knownStatuses are the statuses the rows gauge reports, reset on every refresh.
var knownStatuses = []string{"pending", "held", "dead", "awaiting_approval"}

// refreshStats updates the row gauges and warns about rows for unknown connectors. The
// gauges change only once a query has been read to its end: pgx reports most failures
// (a lock or statement timeout, a cancel, a lost connection) from rows.Err rather than
// from Query, and a refresh that reset the gauges first would then report no rows
// waiting at all. A failed refresh keeps the last values.
func (r *Relay) refreshStats(ctx context.Context) {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	local := r.cfg.NowFunc()
	fail := func(err error) {
		r.ageOldestPending(local)
		if !stopping(ctx) {
			r.failed(ctx, "stats", statsFailed, err)
		}
	}
	rows, err := r.pool.Query(ctx, statsSQL, r.corrected(local))
	if err != nil {
		fail(err)
		return
	}
	stats, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (rowStat, error) {
		var s rowStat
		err := row.Scan(&s.connector, &s.status, &s.count, &s.oldest, &s.dueWait)
		return s, err
	})
	if err != nil {
		fail(err)
		return
	}
	type unknown struct {
		connector string
		count     int64
	}
	rows, err = r.pool.Query(ctx, unknownConnectorsSQL, nonNil(r.names), r.corrected(local))
	if err != nil {
		fail(err)
		return
	}
	unknowns, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (unknown, error) {
		var u unknown
		err := row.Scan(&u.connector, &u.count)
		return u, err
	})
	if err != nil {
		fail(err)
		return
	}
	r.recovered(ctx, statsFailed)

	r.metrics.rows.Reset()
	r.metrics.oldestPending.Reset()
	r.metrics.oldestDueWait.Reset()
	for _, name := range r.names {
		for _, st := range knownStatuses {
			r.metrics.rows.WithLabelValues(name, st).Set(0)
		}
		r.metrics.oldestPending.WithLabelValues(name).Set(0)
		r.metrics.oldestDueWait.WithLabelValues(name).Set(0)
	}
	// Connectors this relay does not have get a series each only for the
	// maxUnknownSeries with most rows, as in outboxd_unknown_connector_rows; the rows of
	// the others are counted together as otherConnectors, so that rows for many names
	// (webhook:<customer>) do not grow a series per name.
	label := r.statsLabels(stats)
	type series struct{ connector, status string }
	counts, oldest := map[series]int64{}, map[string]pendingAges{}
	for _, s := range stats {
		name := label(s.connector)
		counts[series{name, s.status}] += s.count
		if s.status == statusPending {
			o := oldest[name]
			oldest[name] = pendingAges{age: max(o.age, s.oldest), dueWait: max(o.dueWait, s.dueWait)}
		}
	}
	for k, n := range counts {
		r.metrics.rows.WithLabelValues(k.connector, k.status).Set(float64(n))
	}
	for name, a := range oldest {
		r.metrics.oldestPending.WithLabelValues(name).Set(a.age)
		r.metrics.oldestDueWait.WithLabelValues(name).Set(a.dueWait)
	}
	r.oldestPending, r.oldestPendingAt = oldest, local
	// One series and one warning for all of them: the connectors with most rows by
	// name, the rest together, so that rows for many names (webhook:<customer>, from an
	// application or a token allowed every connector) neither flood the log every
	// refresh nor grow a series per name.
	r.metrics.unknownConnector.Reset()
	if len(unknowns) == 0 {
		r.unknownWarned, r.unknownWarnedAt = nil, time.Time{} // rows that come later are warned about at once
		return
	}
	waiting := make(map[string]int64, len(unknowns))
	var total int64
	for _, u := range unknowns {
		waiting[u.connector] = u.count
		total += u.count
	}
	others := total
	top := mostRows(waiting)
	named := make([]string, 0, len(top))
	for _, name := range top {
		r.metrics.unknownConnector.WithLabelValues(name).Set(float64(waiting[name]))
		named = append(named, fmt.Sprintf("%s=%d", name, waiting[name]))
		others -= waiting[name]
	}
	if others > 0 {
		r.metrics.unknownConnector.WithLabelValues(otherConnectors).Set(float64(others))
	}
	// At every refresh (every statsInterval, on every relay) for as long as the rows
	// waited, which may be days (an instance removed from the configuration with rows
	// left), the warning filled the log, saying nothing new: it comes when a connector
	// appears that the last one did not name, and otherwise once every troubleWarnEvery,
	// as the warnings of work that keeps failing do (see failed). The gauge follows every
	// refresh.
	fresh := false
	for name := range waiting {
		fresh = fresh || !r.unknownWarned[name]
	}
	if !fresh && local.Sub(r.unknownWarnedAt) < troubleWarnEvery {
		return
	}
	r.unknownWarned, r.unknownWarnedAt = map[string]bool{}, local
	for name := range waiting {
		r.unknownWarned[name] = true
	}
	r.log.WarnContext(ctx, "rows waiting for connectors this relay does not have, nor any other running relay (pending, or left delivering by a relay that stopped); they wait (never dead, never lost) until a relay with them runs",
		"connectors", len(unknowns), "rows", total, "most_rows", named, "configured", r.names)
}

// pendingAges are a connector's oldest pending row's age and how long its oldest due row
// has waited since it fell due, in seconds.
type pendingAges struct{ age, dueWait float64 }

// ageOldestPending moves outboxd_oldest_pending_age_seconds (and
// outboxd_oldest_due_wait_seconds) on by the time since the last refresh that worked, to
// local (NowFunc's reading), for a refresh that failed. Kept at
// its last value, it stood still for as long as the refreshes failed: while the database
// was away, or the refresh timed out on a backlog grown large, the very times rows wait
// longest, an alert on it never fired. The oldest row then seen is taken to wait still:
// it cannot have been delivered while the database was away, and it may have been, when
// only the refresh fails, which outboxd_database_errors_total{operation="stats"} and the
// warning tell.
func (r *Relay) ageOldestPending(local time.Time) {
	if r.oldestPendingAt.IsZero() {
		return // no refresh has worked yet
	}
	waited := local.Sub(r.oldestPendingAt).Seconds()
	for name, a := range r.oldestPending {
		if a.age > 0 {
			r.metrics.oldestPending.WithLabelValues(name).Set(a.age + waited)
		}
		if a.dueWait > 0 {
			r.metrics.oldestDueWait.WithLabelValues(name).Set(a.dueWait + waited)
		}
	}
}

// rowStat is one row of statsSQL.
type rowStat struct {
	connector, status string
	count             int64
	oldest, dueWait   float64
}

// statsLabels returns the connector label of stats' rows: the connector itself when this
// relay has it or it is one of the maxUnknownSeries others with most rows, else
// otherConnectors.
func (r *Relay) statsLabels(stats []rowStat) func(connector string) string {
	unknown := map[string]int64{}
	for _, s := range stats {
		if _, ok := r.instances[s.connector]; !ok {
			unknown[s.connector] += s.count
		}
	}
	named := map[string]bool{}
	for _, name := range mostRows(unknown) {
		named[name] = true
	}
	return func(connector string) string {
		if _, ok := r.instances[connector]; ok || named[connector] {
			return connector
		}
		return otherConnectors
	}
}

// mostRows returns the maxUnknownSeries connectors of counts with most rows, most first
// (ties by name): those of the connectors this relay does not have that get series of
// their own; the rows of the others are counted together as otherConnectors.
func mostRows(counts map[string]int64) []string {
	names := slices.Collect(maps.Keys(counts))
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b)) })
	return names[:min(len(names), maxUnknownSeries)]
}

// deleteExpired deletes delivered and canceled rows older than the retention, in small
// batches so it never holds long locks.
func (r *Relay) deleteExpired(ctx context.Context) {
	cutoff := r.now().Add(-r.cfg.Retention)
	var total int64
	// Said however the pass ends: one that failed or was stopped after many batches
	// (a backlog after retention was shortened) said only that it failed, as though it
	// had deleted nothing.
	defer func() {
		if total > 0 {
			r.log.InfoContext(ctx, "deleted finished rows past retention", "rows", total, "retention", r.cfg.Retention)
		}
	}()
	// Where the next batch starts: after the last row of the previous one.
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	afterID := int64(math.MinInt64) // plain SQL may write any id
	for ctx.Err() == nil {
		var (
			n      int64
			lastID *int64
		)
		bctx, cancel := context.WithTimeoutCause(ctx, r.maintainTimeout, errMaintainTimeout)
		err := r.pool.QueryRow(bctx, retentionSQL, cutoff, retentionBatch, nonNil(r.names), after, afterID).
			Scan(&n, &after, &lastID)
		// Looked at before the cancel: once cancelled, bctx reads as the relay stopping
		// (its cause is context.Canceled), and a failure would go unreported.
		stopped := err != nil && stopping(bctx)
		cancel()
		if err != nil {
			if !stopped {
				r.failed(ctx, "retention", retentionFailed, err)
			}
			return
		}
		r.recovered(ctx, retentionFailed)
		total += n
		if n < retentionBatch {
			break
		}
		afterID = *lastID
	}
}

// nonNil makes a nil list an empty SQL array rather than NULL, which would match nothing
// in "= ANY" but also nothing in "<> ALL".
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// maxUnknownSeries is how many connectors this relay does not have, those with most
// rows, get a series of their own in outboxd_unknown_connector_rows (and a mention in
// the warning); the rows of the others are counted together as otherConnectors, a
// label no connector can have.
const (
	maxUnknownSeries = 20
	otherConnectors  = "(others)"
)
