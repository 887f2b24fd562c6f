package relay

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
	said   time.Time // the last warning once a minute
	quiet  int       // failures since the last warning, not warned about
	// kinds are the kinds of failure (see failureKind) warned about since said: a
	// failure of another kind is warned about at once.
	kinds map[string]bool
}

// failureKind tells apart the failures that an operator must hear of at once, though
// the same work failed, and was warned about, less than a minute before: a SQLSTATE
// of its own for each error PostgreSQL reports (the database refusing writes after a
// failover to a server that takes none, a privilege revoked, a server shutting down),
// "timeout" for a time limit that ran out, and one kind for every other failure (a
// connection refused, reset or lost), which a flaky network repeats in many words.
func failureKind(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return "SQLSTATE " + pgErr.Code
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) {
		return "timeout"
	}
	return ""
}

// failed counts a failure of the database work labelled op (outboxd_database_errors_total
// counts every one) and logs msg at warn level, with err and args, at its first failure
// and then at most once every troubleWarnEvery while it keeps failing, or fails again,
// saying how many failed since the last warning and for how long the run of failures
// has lasted. A failure of a kind not warned about in that minute (see failureKind) is
// warned about at once: counted into the next warning, a failover to a server that
// takes no writes, whose first refused round resets the pool and whose next works,
// within a minute of a flaky network's warning, went unsaid but as a number.
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
	kind := failureKind(err)
	minute := run.said.IsZero() || now.Sub(run.said) >= troubleWarnEvery
	warn := minute || !run.kinds[kind]
	quiet, since, total := run.quiet, run.since, run.total
	switch {
	case minute:
		run.said, run.kinds = now, map[string]bool{kind: true}
	case warn:
		// said stays: failures of the kinds already warned about are warned about again
		// a minute after the last warning that came once a minute.
		run.kinds[kind] = true
	}
	if warn {
		run.quiet, run.warned = 0, true
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
