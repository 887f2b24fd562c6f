package relay

import (
	"context"
	"sync"
	"time"
)

// troubleWarnEvery is the least time between two warnings about the same failing work
// (see Relay.failed).
const troubleWarnEvery = time.Minute

// trouble is what the relay remembers of its database work that keeps failing, by the
// warning that work logs: while the database is away, or takes no writes (a standby
// after a failover, default_transaction_read_only), every claim round, every reclaim
// (each poll interval), every parking pass and every refresh fails, and a warning for
// each filled the log with several lines a second that said nothing new.
type trouble struct {
	mu   sync.Mutex
	runs map[string]*troubleRun
}

// troubleRun is one run of failures of one kind of work, from the first to the next
// success.
type troubleRun struct {
	since  time.Time // the first failure
	warned time.Time // the last warning
	quiet  int       // failures since that warning
	total  int       // failures in the run
}

// failed counts a failure of the database work labelled op (outboxd_database_errors_total
// counts every one) and logs msg at warn level, with err and args, at its first failure
// and then at most once every troubleWarnEvery while it keeps failing, saying how many
// failed since the last warning and for how long it has failed.
func (r *Relay) failed(ctx context.Context, op, msg string, err error, args ...any) {
	r.metrics.dbErrors.WithLabelValues(op).Inc()
	now := r.cfg.NowFunc()
	r.trouble.mu.Lock()
	if r.trouble.runs == nil {
		r.trouble.runs = map[string]*troubleRun{}
	}
	run := r.trouble.runs[msg]
	if run == nil {
		run = &troubleRun{since: now}
		r.trouble.runs[msg] = run
	}
	run.total++
	warn := run.warned.IsZero() || now.Sub(run.warned) >= troubleWarnEvery
	quiet, since := run.quiet, run.since
	if warn {
		run.warned, run.quiet = now, 0
	} else {
		run.quiet++
	}
	r.trouble.mu.Unlock()
	if !warn {
		return
	}
	args = append([]any{"err", err}, args...)
	if quiet > 0 {
		args = append(args, "failed_since_last_warning", quiet, "failing_for", now.Sub(since).Round(time.Second))
	}
	r.log.WarnContext(ctx, msg, args...)
}

// recovered ends the run of failures of the work that logs msg (see failed), if one was
// under way, with a line at info level saying how many times it failed, and for how long.
func (r *Relay) recovered(ctx context.Context, msg string) {
	r.trouble.mu.Lock()
	run := r.trouble.runs[msg]
	delete(r.trouble.runs, msg)
	r.trouble.mu.Unlock()
	if run == nil {
		return
	}
	r.log.InfoContext(ctx, "working again after failures", "failed", msg, "failures", run.total,
		"failing_for", r.cfg.NowFunc().Sub(run.since).Round(time.Second))
}
