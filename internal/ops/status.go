package ops

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/outbox"
)

// Verdicts of [Status], worst first.
const (
	VerdictStuck   = "rows stuck"
	VerdictDead    = "dead letters"
	VerdictBacklog = "backlog growing"
	VerdictHealthy = "healthy"
)

// BacklogThreshold is how long a due pending row may wait for a relay before [Status]
// says the backlog is growing.
const BacklogThreshold = time.Minute

// Counts holds the number of rows in each status.
type Counts struct {
	Pending          int `json:"pending"`
	Delivering       int `json:"delivering"`
	Delivered        int `json:"delivered"`
	Dead             int `json:"dead"`
	Canceled         int `json:"canceled"`
	AwaitingApproval int `json:"awaiting_approval"`
	Held             int `json:"held"`
}

// ConnectorStatus is the state of one connector instance's rows.
type ConnectorStatus struct {
	Connector string `json:"connector"`
	Counts    Counts `json:"counts"`
	// OldestPendingAge is how long ago the oldest pending row was created; zero when
	// none is pending. It includes rows scheduled for later (backoff, not_before).
	OldestPendingAge time.Duration `json:"oldest_pending_age"`
	// OldestDueWait is how long the longest-waiting due pending row has been due
	// (now - next_attempt_at); zero when no pending row is due. Rows that wait for an
	// earlier row of their ordering key are left out: no relay could take them. This, not
	// OldestPendingAge, decides [VerdictBacklog]: a row waiting out its backoff is not
	// a backlog.
	OldestDueWait time.Duration `json:"oldest_due_wait"`
	// Stuck counts delivering rows whose lease has expired: their relay died or lost
	// the database, and no relay with this connector has put them back yet.
	Stuck int `json:"stuck"`
	// Ambiguous counts rows whose latest attempt may or may not have reached the receiver.
	Ambiguous int `json:"ambiguous"`
	// DeadLastHour and DeadLastDay count dead rows that went dead (were last changed)
	// within the hour and the 24 hours before now.
	DeadLastHour int    `json:"dead_last_hour"`
	DeadLastDay  int    `json:"dead_last_day"`
	Verdict      string `json:"verdict"`
	// RelayRunning says whether a running relay has this connector instance, as the
	// relays say in outbox_wake_connectors (their word, renewed while they run, has not
	// lapsed); nil when that cannot be read (a schema before version 5, which has no
	// such table; a role whose SELECT on it, granted to PUBLIC, was revoked). Without
	// one, pending rows and rows left in delivering wait until a relay with the instance
	// runs. Relays of schema version 4, or without their grants on
	// outbox_wake_connectors, deliver without saying so.
	RelayRunning *bool `json:"relay_running,omitempty"`
}

// WaitsForARelay reports whether the connector has rows that only a relay with it can
// move on (pending, or stuck in delivering) and no running relay has it.
func (cs ConnectorStatus) WaitsForARelay() bool {
	return cs.RelayRunning != nil && !*cs.RelayRunning && (cs.Counts.Pending > 0 || cs.Stuck > 0)
}

// Report is what [Status] returns: one line per connector that has rows, by name.
type Report struct {
	Now        time.Time         `json:"now"`
	Connectors []ConnectorStatus `json:"connectors"`
	// Verdict is the worst of the connectors' verdicts; healthy when there are none.
	Verdict string `json:"verdict"`
}

// statusSQL summarises the table by connector against the clock $1, in one pass.
// Ages are differences of epochs, not of timestamps: PostgreSQL before 17 refuses to
// subtract an infinite timestamp, which plain SQL may write into created_at or
// next_attempt_at, and one such row would fail the whole report; -infinity reads as an
// age of +Inf (see seconds).
// Each FILTER reads the same scan, so the cost is one sequential (or index-only) read.
// Every $1 beside an interval is cast: in the simple protocol (behind a transaction
// pooler) each is written in as an untyped literal, which "- interval" reads as an
// interval.
// The last day is 24 hours, not interval '1 day': subtracted from a timestamptz, a day
// is a calendar day of the session's time zone, 23 or 25 hours across a daylight saving
// change, and DEAD 24H (and the dead-letters verdict) left out a row that went dead
// 23.5 hours before.
// A due row counts for the backlog only when a relay could claim it: not while an
// earlier row of its ordering key is unfinished (the claim's own rule, relay/sql.go), for
// then it waits for that row (its backoff, its approval, an operator), not for a relay.
const statusSQL = `
SELECT connector,
       count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'delivering'),
       count(*) FILTER (WHERE status = 'delivered'),
       count(*) FILTER (WHERE status = 'dead'),
       count(*) FILTER (WHERE status = 'canceled'),
       count(*) FILTER (WHERE status = 'awaiting_approval'),
       count(*) FILTER (WHERE status = 'held'),
       coalesce(extract(epoch FROM $1::timestamptz) - extract(epoch FROM min(created_at) FILTER (WHERE status = 'pending')), 0)::float8,
       coalesce(extract(epoch FROM $1::timestamptz) - extract(epoch FROM min(next_attempt_at) FILTER (WHERE status = 'pending' AND next_attempt_at <= $1
           AND (ordering_key IS NULL OR NOT EXISTS (
                 SELECT 1 FROM outbox p
                 WHERE p.ordering_key = o.ordering_key AND p.id < o.id
                   AND p.status IN ('pending', 'delivering', 'held', 'awaiting_approval'))))), 0)::float8,
       count(*) FILTER (WHERE status = 'delivering' AND lease_expires_at < $1),
       count(*) FILTER (WHERE ambiguous),
       count(*) FILTER (WHERE status = 'dead' AND updated_at >= $1::timestamptz - interval '1 hour'),
       count(*) FILTER (WHERE status = 'dead' AND updated_at >= $1::timestamptz - interval '24 hours')
FROM outbox o
GROUP BY connector
ORDER BY connector`

// relaysSQL lists the connector instances that some running relay has at $1: its word in
// outbox_wake_connectors (relay/sql.go, seenSQL) has not lapsed. The relays' warning
// about rows of connectors no running relay has reads the same (unknownConnectorsSQL).
const relaysSQL = `SELECT DISTINCT connector FROM outbox_wake_connectors WHERE seen_until > $1::timestamptz`

// Status summarises the outbox per connector at now (zero means the current time), in
// one query (and a second for which connectors running relays have, see relaysRunning),
// and gives each connector a verdict, worst first:
//
//   - [VerdictStuck] when a delivering row's lease has expired or a row is held: both
//     wait for something (a relay with the connector, an operator) rather than for time.
//   - [VerdictDead] when a row went dead within the last day. Older dead rows are still
//     counted but no longer raise the alarm.
//   - [VerdictBacklog] when a due pending row has waited more than [BacklogThreshold]
//     for a relay: relays are missing, too slow, or do not have the connector.
//   - [VerdictHealthy] otherwise.
//
// Rows awaiting approval wait for a person by design and do not change the verdict.
func Status(ctx context.Context, db outbox.DB, now time.Time) (Report, error) {
	now, err := dbNowOr(ctx, db, now)
	if err != nil {
		return Report{}, fmt.Errorf("status: %w", err)
	}
	rows, err := db.Query(ctx, statusSQL, now)
	if err != nil {
		return Report{}, fmt.Errorf("status: %w", err)
	}
	defer rows.Close()
	rep := Report{Now: now, Verdict: VerdictHealthy, Connectors: []ConnectorStatus{}}
	for rows.Next() {
		var (
			cs           ConnectorStatus
			oldest, wait float64
		)
		c := &cs.Counts
		if err := rows.Scan(&cs.Connector, &c.Pending, &c.Delivering, &c.Delivered, &c.Dead, &c.Canceled,
			&c.AwaitingApproval, &c.Held, &oldest, &wait, &cs.Stuck, &cs.Ambiguous,
			&cs.DeadLastHour, &cs.DeadLastDay); err != nil {
			return Report{}, fmt.Errorf("status: %w", err)
		}
		cs.OldestPendingAge = seconds(oldest)
		cs.OldestDueWait = seconds(wait)
		cs.Verdict = verdict(cs)
		if severity(cs.Verdict) > severity(rep.Verdict) {
			rep.Verdict = cs.Verdict
		}
		rep.Connectors = append(rep.Connectors, cs)
	}
	if err := rows.Err(); err != nil {
		return Report{}, fmt.Errorf("status: %w", err)
	}
	if err := relaysRunning(ctx, db, now, rep.Connectors); err != nil {
		return Report{}, fmt.Errorf("status: %w", err)
	}
	return rep, nil
}

// relaysRunning sets each connector's RelayRunning at now, leaving it nil when the
// relays' words cannot be read: a schema before version 5, which has no
// outbox_wake_connectors, or a role whose SELECT on it was revoked. Within a
// transaction, such a failure aborts it.
func relaysRunning(ctx context.Context, db outbox.DB, now time.Time, cs []ConnectorStatus) error {
	if len(cs) == 0 {
		return nil
	}
	rows, err := db.Query(ctx, relaysSQL, now)
	if err == nil {
		running := map[string]bool{}
		var c string
		for rows.Next() {
			if err = rows.Scan(&c); err != nil {
				break
			}
			running[c] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if err == nil {
			for i := range cs {
				r := running[cs[i].Connector]
				cs[i].RelayRunning = &r
			}
			return nil
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "42P01") { // insufficient_privilege, undefined_table
		return nil
	}
	return fmt.Errorf("read which connectors running relays have: %w", err)
}

func verdict(cs ConnectorStatus) string {
	switch {
	case cs.Stuck > 0 || cs.Counts.Held > 0:
		return VerdictStuck
	case cs.DeadLastDay > 0:
		return VerdictDead
	case cs.OldestDueWait > BacklogThreshold:
		return VerdictBacklog
	default:
		return VerdictHealthy
	}
}

func severity(v string) int {
	switch v {
	case VerdictStuck:
		return 3
	case VerdictDead:
		return 2
	case VerdictBacklog:
		return 1
	default:
		return 0
	}
}

// seconds converts a non-negative number of seconds to a duration, rounded to the
// microsecond (PostgreSQL's resolution); past the longest duration (+Inf: a row created
// at -infinity), the longest.
func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	if s >= float64(math.MaxInt64/int64(time.Second)) { // +Inf included
		return math.MaxInt64
	}
	return (time.Duration(s * float64(time.Second))).Round(time.Microsecond)
}
