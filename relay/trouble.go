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

// troubleRun is what the relay remembers of one kind of work's failures: the run of
// them under way, from its first failure to the next success, and the last warning,
// which outlives the run it was part of. Work that fails now and then (a flaky
// network, a statement timeout under load) fails and works by turns: each failure
// began a run of its own, warned about at once, and each success ended it with a line
// of its own, two lines every poll interval for as long as it went on.
type troubleRun struct {
	since  time.Time // the run's first failure; zero while none is under way
	total  int       // failures in the run
	warned bool      // the run was warned about
	said   time.Time // the last warning
	quiet  int       // failures since that warning, not warned about
}

// failed counts a failure of the database work labelled op (outboxd_database_errors_total
// counts every one) and logs msg at warn level, with err and args, at its first failure
// and then at most once every troubleWarnEvery while it keeps failing, or fails again,
// saying how many failed since the last warning and for how long the run of failures
// has lasted.
func (r *Relay) failed(ctx context.Context, op, msg string, err error, args ...any) {
	r.metrics.dbErrors.WithLabelValues(op).Inc()
	now := r.cfg.NowFunc()
	r.trouble.mu.Lock()
	if r.trouble.runs == nil {
		r.trouble.runs = map[string]*troubleRun{}
	}
	run := r.trouble.runs[msg]
	if run == nil {
		run = &troubleRun{}
		r.trouble.runs[msg] = run
	}
	if run.since.IsZero() {
		run.since, run.total, run.warned = now, 0, false
	}
	run.total++
	warn := run.said.IsZero() || now.Sub(run.said) >= troubleWarnEvery
	quiet, since, total := run.quiet, run.since, run.total
	if warn {
		run.said, run.quiet, run.warned = now, 0, true
	} else {
		run.quiet++
	}
	r.trouble.mu.Unlock()
	if !warn {
		return
	}
	args = append([]any{"err", err}, args...)
	if quiet > 0 {
		args = append(args, "failed_since_last_warning", quiet)
	}
	if total > 1 {
		args = append(args, "failing_for", now.Sub(since).Round(time.Second))
	}
	r.log.WarnContext(ctx, msg, args...)
}

// recovered ends the run of failures of the work that logs msg (see failed), if one was
// under way, with a line at info level saying how many times it failed, and for how long:
// at once when the run was warned about; else (its failures came too soon after the
// last warning to be warned about) at the first success once troubleWarnEvery has
// passed since that warning, unless a failure is warned about first, with the failures
// since that warning.
func (r *Relay) recovered(ctx context.Context, msg string) {
	r.trouble.mu.Lock()
	run := r.trouble.runs[msg]
	if run == nil {
		r.trouble.mu.Unlock()
		return
	}
	now := r.cfg.NowFunc()
	ended, since, total := run.warned && !run.since.IsZero(), run.since, run.total
	quiet, said := run.quiet, run.said
	if ended {
		run.quiet = 0 // failures of this run, said below
	}
	run.since, run.total, run.warned = time.Time{}, 0, false
	unsaid := !ended && quiet > 0 && now.Sub(said) >= troubleWarnEvery
	if unsaid {
		run.quiet = 0
	}
	if run.quiet == 0 && now.Sub(run.said) >= troubleWarnEvery {
		delete(r.trouble.runs, msg) // nothing left to say, and the next failure is warned about
	}
	r.trouble.mu.Unlock()
	switch {
	case ended:
		r.log.InfoContext(ctx, "working again after failures", "failed", msg, "failures", total,
			"failing_for", now.Sub(since).Round(time.Second))
	case unsaid:
		r.log.InfoContext(ctx, "working again after failures", "failed", msg, "failed_since_last_warning", quiet,
			"last_warning_ago", now.Sub(said).Round(time.Second))
	}
}
