package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sethvargo/go-retry"
)

// notifyChannel is the channel schema.sql's insert trigger notifies.
const notifyChannel = "outbox"

// The LISTEN connection's warnings, which say the same at every failure (see failed).
const (
	listenLost  = "LISTEN connection lost; polling until it is back"
	probeFailed = "could not send the NOTIFY self-test; trying again"
)

// errRelisten ends a LISTEN connection that the claim loop found on a server that takes
// no writes (see takesNoWrites): it is made again, where the pool's new sessions go.
var errRelisten = errors.New("the pool's sessions were on a server that takes no writes")

// listen keeps a dedicated connection LISTENing on the outbox channel and wakes the claim
// loop on every notification. When the connection drops it reconnects with backoff, and
// wakes the claim loop once connected (rows may have arrived meanwhile).
func (r *Relay) listen(ctx context.Context) {
	var failures int
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if r.listening.Swap(false) {
			// The connection was up: this is a new drop, not one more failed try to
			// reconnect, and waits as little as the first.
			failures = 0
		}
		if ctx.Err() != nil {
			return
		}
		failures++
		wait := backoff(failures, 100*time.Millisecond, 5*time.Second)
		if errors.Is(err, errRelisten) {
			// Not a failure of its own: the claim loop has logged the refused round.
			r.log.InfoContext(ctx, "LISTEN connection closed to LISTEN again where the pool's new sessions go; polling until it is back", "err", err, "retry_in", wait)
			sleep(ctx, wait)
			continue
		}
		r.failed(ctx, "listen", listenLost, err, "retry_in", wait)
		sleep(ctx, wait)
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	// The connection made now is the new one a request to make it again asked for.
	select {
	case <-r.relisten:
	default:
	}
	// Made, and its LISTEN sent, within listenCheck, as its ping is answered: ctx has no
	// time limit until the relay stops, and a connection that hung at that moment (no
	// answer and no reset: a partition, a firewall that forgot it, a server that accepts
	// and never answers) held this loop for as long as the kernel retransmitted, or for
	// good (pgx sets no time limit on a connect unless the DSN's connect_timeout does),
	// with no NOTIFY waking the relay and /readyz saying LISTEN was down.
	setupCtx, cancel := context.WithTimeout(ctx, r.listenCheck)
	defer cancel()
	// Connected as the pool connects: its BeforeConnect may set what the DSN does not
	// hold (a password that expires, such as an IAM token, or the current primary).
	poolCfg := r.pool.Config()
	connCfg := poolCfg.ConnConfig
	// But not with the pool's notification callback (OnNotification, an application's
	// own for the LISTENs of its sessions): pgx keeps notifications for
	// WaitForNotification only on a connection without one, so this one would get none
	// of its own (WaitForNotification returned none when one came), and the
	// application's callback would get them. The config is the pool's copy.
	connCfg.OnNotification = nil
	if poolCfg.BeforeConnect != nil {
		if err := poolCfg.BeforeConnect(setupCtx, connCfg); err != nil {
			return fmt.Errorf("connect: %w", err)
		}
	}
	conn, err := pgx.ConnectConfig(setupCtx, connCfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// A connection that only waits is idle to the server: idle_session_timeout (set on
	// the database or the role) ends it, so it is pinged within half of that. Read before
	// the LISTEN, which stays the session's last statement (pg_stat_activity) until a ping.
	check := r.listenCheck
	var idleMillis int64
	if err := conn.QueryRow(setupCtx, `SELECT (extract(epoch FROM coalesce(current_setting('idle_session_timeout', true), '0')::interval) * 1000)::int8`).Scan(&idleMillis); err != nil {
		return fmt.Errorf("read idle_session_timeout: %w", err)
	}
	if half := time.Duration(idleMillis) * time.Millisecond / 2; half > 0 && half < check {
		check = half
	}
	if _, err := conn.Exec(setupCtx, "LISTEN "+notifyChannel); err != nil {
		return fmt.Errorf("LISTEN: %w", err)
	}
	cancel()
	r.listening.Store(true)
	r.recovered(ctx, listenLost)
	// The notifications sent while no connection listened are lost, and one may have been
	// for a row behind where claims start (see below): look from the head, as for one.
	r.rescan.Store(true)
	notify(r.wake)
	// Every connection runs the self-test: outboxd_notify_working is about this one, and
	// drops to 0 as soon as it is gone (the relay then relies on polling). The test ends
	// before the gauge is cleared, so a late answer cannot set it again.
	seen := make(chan struct{})
	probeCtx, stopProbe := context.WithCancel(ctx)
	var probe sync.WaitGroup
	probe.Go(func() { r.checkNotify(probeCtx, seen) })
	defer func() {
		stopProbe()
		probe.Wait()
		r.metrics.notifyWorking.Set(0)
	}()
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	probe.Go(func() {
		select {
		case <-r.relisten:
			stopWait()
		case <-probeCtx.Done():
		}
	})
	for {
		n, err := r.waitForNotification(waitCtx, conn, check)
		if err != nil {
			if ctx.Err() == nil && waitCtx.Err() != nil {
				return errRelisten
			}
			return err
		}
		if n.Payload == r.probe {
			select {
			case <-seen:
			default:
				close(seen)
			}
			continue
		}
		// What woke us may lie behind where claims start: an approved or replayed row
		// keeps its next_attempt_at.
		r.rescan.Store(true)
		notify(r.wake)
	}
}

// waitForNotification waits for conn's next notification, and pings conn whenever none
// came for r.listenCheck, the ping bounded by as much. A connection that died without a
// reset (a NAT gateway or load balancer that dropped it while idle, a database host gone
// after a failover) delivers nothing and reports nothing until TCP keepalive gives up,
// most of an hour with pgx's defaults: meanwhile no NOTIFY woke the relay, and /readyz
// said LISTEN was up. A wait cut short by its own deadline leaves the connection usable
// (pgx's default context handler sets a read deadline and sends no cancel request).
// check is how long a wait lasts before the ping: r.listenCheck, or less where the
// session's idle_session_timeout would end it sooner.
func (r *Relay) waitForNotification(ctx context.Context, conn *pgx.Conn, check time.Duration) (*pgconn.Notification, error) {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, check)
		n, err := conn.WaitForNotification(waitCtx)
		idle := err != nil && ctx.Err() == nil && waitCtx.Err() != nil
		cancel()
		if !idle {
			return n, err
		}
		pingCtx, cancel := context.WithTimeout(ctx, r.listenCheck)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			return nil, fmt.Errorf("no answer to a ping within %s: %w", r.listenCheck, err)
		}
	}
}

// listenCheck is how long the LISTEN connection may stay silent before it is pinged,
// and how long the ping may take, as may making it: a connection that died without a
// reset is found within twice as long.
const listenCheck = 30 * time.Second

// defaultProbeTimeout is how long the NOTIFY self-test waits for its own notification.
const defaultProbeTimeout = 5 * time.Second

// checkNotify sends a NOTIFY through the pool and checks that the LISTEN connection gets
// it. Behind a transaction-mode connection pooler it will not, and the relay must say so
// loudly: it then wakes only every PollInterval. A notification that arrives after that
// says NOTIFY works after all.
func (r *Relay) checkNotify(ctx context.Context, seen <-chan struct{}) {
	// Sent again while it fails (the pool's connections break for a while after
	// PostgreSQL restarts): given up, the gauge would say 0 for as long as this LISTEN
	// connection lasts, though NOTIFY may work.
	b := retry.WithCappedDuration(5*time.Second, retry.NewExponential(100*time.Millisecond))
	err := retry.Do(ctx, b, func(ctx context.Context) error {
		// Each send bounded as the LISTEN connection's ping is: ctx lasts as long as that
		// connection, and a pool connection that hung (no answer, no reset) held the test,
		// the gauge saying 0 though NOTIFY worked, for as long as the kernel retransmitted.
		sendCtx, cancel := context.WithTimeout(ctx, r.listenCheck)
		defer cancel()
		if _, err := r.pool.Exec(sendCtx, `SELECT pg_notify($1, $2)`, notifyChannel, r.probe); err != nil {
			if ctx.Err() == nil {
				r.failed(ctx, "listen", probeFailed, err)
			}
			return retry.RetryableError(err)
		}
		return nil
	})
	if err != nil {
		return // the LISTEN connection is gone, or the relay stops
	}
	r.recovered(ctx, probeFailed)
	t := time.NewTimer(r.probeTimeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-seen:
		r.metrics.notifyWorking.Set(1)
	case <-t.C:
		r.metrics.notifyWorking.Set(0)
		r.log.ErrorContext(ctx, "NOTIFY DOES NOT REACH THIS RELAY: its own test notification did not arrive within "+r.probeTimeout.String()+
			". This happens behind a connection pooler in transaction mode (PgBouncer, RDS Proxy), which does not keep LISTEN sessions. "+
			"Delivery still works, but new rows wait up to OUTBOX_POLL_INTERVAL. Point OUTBOX_DATABASE_URL at PostgreSQL directly or at a session-mode pool to fix it.",
			"poll_interval", r.cfg.PollInterval)
		// Late is not never: a busy server (or relay) can hold the notification past the
		// wait, and then NOTIFY does reach this connection. Given up for good, the gauge
		// said 0, and the error stood uncorrected, for as long as the connection lasted,
		// while every insert's NOTIFY woke the relay.
		select {
		case <-ctx.Done():
		case <-seen:
			r.metrics.notifyWorking.Set(1)
			r.log.WarnContext(ctx, "NOTIFY does reach this relay after all: its test notification came late, after the error above; "+
				"the database or the relay was slow to deliver it")
		}
	}
}
