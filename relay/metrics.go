package relay

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's Prometheus series, all named outboxd_*.
type metrics struct {
	deliveries       *prometheus.CounterVec   // by connector, outcome
	deliveryDuration *prometheus.HistogramVec // by connector
	commitToDelivery *prometheus.HistogramVec // by connector: created_at (or NotBefore) to delivered
	claimBatch       prometheus.Histogram
	leaseExpiries    prometheus.Counter
	handedBack       prometheus.Counter
	rows             *prometheus.GaugeVec // by connector, status
	oldestPending    *prometheus.GaugeVec // by connector
	oldestDueWait    *prometheus.GaugeVec // by connector
	unknownConnector *prometheus.GaugeVec // by connector
	notifyWorking    prometheus.Gauge
	dbErrors         *prometheus.CounterVec // by operation
	claimedBytes     prometheus.GaugeFunc
	claimedRows      prometheus.GaugeFunc
	inFlight         prometheus.GaugeFunc
}

// dbOperations are the operations outboxd_database_errors_total counts failures of (see
// Relay.failed).
var dbOperations = []string{"claim", "record", "release", "reclaim", "listen", "seen", "park", "stats", "retention"}

// holdings read what a relay holds at the moment, for its gauges.
type holdings struct {
	claimedBytes func() float64 // payload bytes of the rows it holds claimed
	claimedRows  func() float64 // rows it holds claimed, waiting for a worker or in flight
	inFlight     func() float64 // deliveries in flight
}

// ownedCollector is one of a relay's series as registered: stopped is set once that
// relay's Run has returned, so that a relay made after it on the same Registerer can
// take its place (see newMetrics).
type ownedCollector struct {
	prometheus.Collector
	stopped *atomic.Bool
}

// newMetrics registers the relay's series on reg. Series of a relay whose Run has
// returned (stopped, as set on its own) are replaced: a Relay runs once, and its
// successor is made with New on the application's same Registerer. Until then they are
// left registered, so that their last values can still be gathered.
func newMetrics(reg prometheus.Registerer, h holdings, stopped *atomic.Bool) (*metrics, error) {
	latency := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	// A row's lag runs far past a minute: delivered after an outage or a backlog, or on a
	// retry (backoff up to an hour, for up to the 72 hours of OUTBOX_MAX_AGE). Ended at
	// 60 s, every such row fell in +Inf, and histogram_quantile said 60 s of a p99 of an
	// hour, so no alert on a lag of minutes could fire.
	lag := append(slices.Clone(latency), 120, 300, 600, 1800, 3600, 2*3600, 6*3600, 24*3600, 72*3600)
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_deliveries_total", Help: "Delivery attempts by connector and outcome (delivered, retry, dead, held).",
		}, []string{"connector", "outcome"}),
		deliveryDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "outboxd_delivery_duration_seconds", Help: "Time a connector took for one attempt.", Buckets: latency,
		}, []string{"connector"}),
		commitToDelivery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "outboxd_commit_to_delivery_seconds", Help: "Time from a row's creation (its NotBefore time, when later, unless the row was parked behind an earlier row of its ordering key) to its successful delivery.", Buckets: lag,
		}, []string{"connector"}),
		claimBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outboxd_claim_batch_rows", Help: "Rows taken by one claim.", Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		leaseExpiries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_lease_expiries_total", Help: "Rows whose relay's lease expired mid-attempt: put back, or held (the hold policy) or sent to dead (their last attempt, or past their maximum age).",
		}),
		handedBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_claims_handed_back_total", Help: "Claimed rows that waited too long for a worker or a delivery slot (too long to finish inside their lease) and were handed back unsent.",
		}),
		rows: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_rows", Help: "Rows waiting by connector and status: pending, held, awaiting_approval and dead (rows being delivered: outboxd_claimed_rows of each relay). Of the connectors this relay does not have, the 20 with most rows have series of their own, the others' rows are counted together as connector=\"(others)\".",
		}, []string{"connector", "status"}),
		oldestPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_oldest_pending_age_seconds", Help: "Age of the oldest pending row by connector, 0 for an instance of this relay's with none (those this relay does not have as in outboxd_rows). While the refresh fails, it goes on growing from the last refresh that worked.",
		}, []string{"connector"}),
		oldestDueWait: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_oldest_due_wait_seconds", Help: "How long the oldest pending row that is due (its next_attempt_at passed) has waited since it fell due, by connector; 0 when none (series as in outboxd_oldest_pending_age_seconds). Rows scheduled for later, a retry's backoff or a not_before, count only once due: the gauge to alert on for a relay that does not keep up. While the refresh fails, it goes on growing from the last refresh that worked.",
		}, []string{"connector"}),
		unknownConnector: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_unknown_connector_rows", Help: "Rows for connectors neither this relay nor another running relay has, pending or left delivering by a relay that stopped (lease expired); they wait for a relay with the connector, never lost. The 20 connectors with most rows have a series each, the others' rows are counted together as connector=\"(others)\".",
		}, []string{"connector"}),
		notifyWorking: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_notify_working", Help: "1 when NOTIFY wake-ups reach this relay, 0 when it relies on polling.",
		}),
		dbErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_database_errors_total", Help: "Database operations that failed and were retried, by operation.",
		}, []string{"operation"}),
		claimedBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "outboxd_claimed_payload_bytes", Help: "Payload and header bytes of the rows this relay holds claimed, waiting for a worker or in flight (bounded by OUTBOX_MAX_CLAIMED_BYTES).",
		}, h.claimedBytes),
		claimedRows: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "outboxd_claimed_rows", Help: "Rows this relay holds claimed, waiting for a worker or in flight.",
		}, h.claimedRows),
		inFlight: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "outboxd_deliveries_in_flight", Help: "Deliveries in flight, at most OUTBOX_CONCURRENCY (one busy instance among several: less a slot kept for each other instance). Below it while rows are pending and outboxd_claimed_rows is low, the workers wait for claims: the database, not the receivers, limits the rate.",
		}, h.inFlight),
	}
	// A series for each operation from the start, at 0: one that appeared with its first
	// failure, at 1, showed rate() and increase() no increase (they need a sample before
	// it), so an alert on them missed that failure, the only one of a failure that does
	// not last.
	for _, op := range dbOperations {
		m.dbErrors.WithLabelValues(op)
	}
	var registered, replaced []prometheus.Collector
	for _, c := range []prometheus.Collector{m.deliveries, m.deliveryDuration, m.commitToDelivery, m.claimBatch,
		m.leaseExpiries, m.handedBack, m.rows, m.oldestPending, m.oldestDueWait, m.unknownConnector, m.notifyWorking, m.dbErrors, m.claimedBytes, m.claimedRows, m.inFlight} {
		owned := ownedCollector{c, stopped}
		err := reg.Register(owned)
		var dup prometheus.AlreadyRegisteredError
		if errors.As(err, &dup) {
			if prev, ok := dup.ExistingCollector.(ownedCollector); ok && prev.stopped.Load() && reg.Unregister(prev) {
				replaced = append(replaced, prev)
				err = reg.Register(owned)
			} else if ok {
				// Prometheus' own words do not say whose series they are, nor what to do.
				err = fmt.Errorf("%w: another relay that has not stopped uses this Registerer; give each relay its own, "+
					"or wrap it for each with prometheus.WrapRegistererWith and a label that tells the relays apart", err)
			}
		}
		if err != nil {
			// Leave the registry as it was, so a corrected New can register again.
			for _, done := range registered {
				reg.Unregister(done)
			}
			for _, prev := range replaced {
				_ = reg.Register(prev)
			}
			return nil, err
		}
		registered = append(registered, owned)
	}
	return m, nil
}
