package relay

import (
	"context"
	"time"
)

// Intervals of the background work. Reclaiming runs every poll interval, so a dead
// relay's rows come back soon after their lease expires.
const (
	statsInterval     = 10 * time.Second
	retentionInterval = time.Minute
	retentionBatch    = 1000
)

// maintain runs the periodic work: put back rows whose lease expired, refresh the gauges,
// report rows for unknown connectors, and delete rows past retention.
func (r *Relay) maintain(ctx context.Context) {
	reclaim := time.NewTicker(r.cfg.PollInterval)
	defer reclaim.Stop()
	stats := time.NewTicker(statsInterval)
	defer stats.Stop()
	retention := time.NewTicker(retentionInterval)
	defer retention.Stop()

	r.reclaim(ctx)
	r.refreshStats(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-reclaim.C:
			r.reclaim(ctx)
		case <-stats.C:
			r.refreshStats(ctx)
		case <-retention.C:
			r.deleteExpired(ctx)
		}
	}
}

// reclaim puts back rows whose lease expired and wakes the claim loop when it did, with
// its next claims starting at the head of the index.
func (r *Relay) reclaim(ctx context.Context) {
	tag, err := r.pool.Exec(ctx, reclaimSQL, r.now(), r.cfg.MaxAttempts, nonNil(r.hold), nonNil(r.names), r.maxAges)
	if err != nil {
		if ctx.Err() == nil {
			r.metrics.dbErrors.WithLabelValues("reclaim").Inc()
			r.log.WarnContext(ctx, "reclaiming expired leases failed; trying again next poll", "err", err)
		}
		return
	}
	if n := tag.RowsAffected(); n > 0 {
		r.metrics.leaseExpiries.Add(float64(n))
		r.log.WarnContext(ctx, "rows put back after their relay's lease expired; their last attempt is recorded as ambiguous", "rows", n)
		// A row sent to dead lets the next row of its ordering key go, which may lie
		// behind where claims start.
		r.rescan.Store(true)
		notify(r.wake)
	}
}

// knownStatuses are the statuses the rows gauge reports, reset on every refresh.
var knownStatuses = []string{"pending", "held", "dead", "awaiting_approval"}

// refreshStats updates the row gauges and warns about rows for unknown connectors.
func (r *Relay) refreshStats(ctx context.Context) {
	rows, err := r.pool.Query(ctx, statsSQL, r.now())
	if err != nil {
		if ctx.Err() == nil {
			r.metrics.dbErrors.WithLabelValues("stats").Inc()
			r.log.WarnContext(ctx, "reading row statistics failed", "err", err)
		}
		return
	}
	r.metrics.rows.Reset()
	r.metrics.oldestPending.Reset()
	for _, name := range r.names {
		for _, st := range knownStatuses {
			r.metrics.rows.WithLabelValues(name, st).Set(0)
		}
	}
	for rows.Next() {
		var (
			connector, status string
			count             int64
			oldest            float64
		)
		if err := rows.Scan(&connector, &status, &count, &oldest); err != nil {
			rows.Close()
			return
		}
		r.metrics.rows.WithLabelValues(connector, status).Set(float64(count))
		if status == statusPending {
			r.metrics.oldestPending.WithLabelValues(connector).Set(oldest)
		}
	}
	rows.Close()

	rows, err = r.pool.Query(ctx, unknownConnectorsSQL, nonNil(r.names))
	if err != nil {
		return
	}
	defer rows.Close()
	r.metrics.unknownConnector.Reset()
	for rows.Next() {
		var (
			connector string
			count     int64
		)
		if err := rows.Scan(&connector, &count); err != nil {
			return
		}
		r.metrics.unknownConnector.WithLabelValues(connector).Set(float64(count))
		r.log.WarnContext(ctx, "pending rows for a connector this relay does not have; they wait (never dead, never lost) until a relay with it runs",
			"connector", connector, "rows", count, "configured", r.names)
	}
}

// deleteExpired deletes delivered and canceled rows older than the retention, in small
// batches so it never holds long locks.
func (r *Relay) deleteExpired(ctx context.Context) {
	cutoff := r.now().Add(-r.cfg.Retention)
	var total int64
	for ctx.Err() == nil {
		tag, err := r.pool.Exec(ctx, retentionSQL, cutoff, retentionBatch, nonNil(r.names))
		if err != nil {
			if ctx.Err() == nil {
				r.metrics.dbErrors.WithLabelValues("retention").Inc()
				r.log.WarnContext(ctx, "deleting rows past retention failed; trying again later", "err", err)
			}
			return
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < retentionBatch {
			break
		}
	}
	if total > 0 {
		r.log.InfoContext(ctx, "deleted finished rows past retention", "rows", total, "retention", r.cfg.Retention)
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
