package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// lossyProxy forwards PostgreSQL's wire protocol on loopback and, once armed, loses the
// reply to one request: the first that executes a statement whose SQL contains match and
// returns a row containing marker (any reply, when marker is nil). It reads that reply
// up to its ReadyForQuery, so the server has committed the request's implicit
// transaction, and then closes both connections without forwarding any of it: the commit
// happened, and the client only sees the connection drop. Messages are read and written
// with pgproto3; authentication passes through.
type lossyProxy struct {
	ln     net.Listener
	target string
	pool   *pgxpool.Pool // the relay's pool, through the proxy

	mu     sync.Mutex
	match  string
	marker []byte
	armed  bool
	named  map[string]bool // prepared statements whose SQL contains match
	killed chan struct{}
	// cutOnKill: losing the armed reply also makes the database unreachable (see cut),
	// before the client hears of anything.
	cutOnKill bool
	down      bool // the database is unreachable: connections are refused
	// dropCancels loses every cancel request, as a network partition does: a statement
	// the client gave up on runs on in the database.
	dropCancels bool
	live        map[*proxyConn]struct{} // connections open through the proxy
	// hold: the first request whose SQL contains it is held, unsent, until gate is
	// closed; held is closed when it is (see holdOnce).
	hold       string
	held, gate chan struct{}
}

// holdOnce holds the next request whose SQL contains match until release is called,
// and returns a channel closed once that request is held.
func (p *lossyProxy) holdOnce(t *testing.T, match string) (held <-chan struct{}, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold, p.held, p.gate = match, make(chan struct{}), make(chan struct{})
	gate := p.gate
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return p.held, release
}

// cut makes the database unreachable: open connections break, new ones are refused.
func (p *lossyProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked()
}

// partition breaks the network between relay and database as a partition does: open
// connections break, new ones are refused, and pgx's cancel requests are lost too, so a
// statement still running in the database goes on.
func (p *lossyProxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropCancels = true
	p.cutLocked()
}

func (p *lossyProxy) cutLocked() {
	p.down = true
	for pc := range p.live {
		pc.close()
	}
}

// restore makes the database reachable again.
func (p *lossyProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func startLossyProxy(t *testing.T, dsn string) *lossyProxy {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &lossyProxy{ln: ln, target: net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))),
		named: map[string]bool{}, killed: make(chan struct{}), live: map[*proxyConn]struct{}{}}
	t.Cleanup(func() { _ = ln.Close() })
	go p.serve()
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.TLSConfig = nil
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	p.pool = pool
	return p
}

func (p *lossyProxy) arm(match string, marker []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.match, p.marker, p.armed = match, marker, true
}

func (p *lossyProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		pc := &proxyConn{p: p, c: c, s: s, be: pgproto3.NewBackend(c, c), fe: pgproto3.NewFrontend(s, s)}
		// Checked again under the lock cut holds: a connection accepted just before a cut
		// and dialled during it would otherwise miss the cut and carry on through the outage.
		p.mu.Lock()
		down = p.down
		if !down {
			p.live[pc] = struct{}{}
		}
		p.mu.Unlock()
		if down {
			_ = c.Close()
			_ = s.Close()
			continue
		}
		go func() {
			defer pc.close()
			if pc.startup() {
				go pc.down()
				pc.up()
			}
		}()
	}
}

type proxyConn struct {
	p       *lossyProxy
	c, s    net.Conn
	be      *pgproto3.Backend  // the client's side: receives its requests, sends it replies
	fe      *pgproto3.Frontend // the server's side: receives its replies, sends it requests
	pending atomic.Bool        // the request in flight executes a matching statement
}

func (pc *proxyConn) close() {
	_ = pc.c.Close()
	_ = pc.s.Close()
	go func() { // not under p.mu, which cut holds
		pc.p.mu.Lock()
		delete(pc.p.live, pc)
		pc.p.mu.Unlock()
	}()
}

// toServer and toClient forward a message, which is only valid until the next Receive.
func (pc *proxyConn) toServer(msg pgproto3.FrontendMessage) bool {
	pc.fe.Send(msg)
	return pc.fe.Flush() == nil
}

func (pc *proxyConn) toClient(msg pgproto3.BackendMessage) bool {
	pc.be.Send(msg)
	return pc.be.Flush() == nil
}

// startup forwards the startup message and the authentication exchange (whatever its
// method) until the server is ready for queries. A cancel request is forwarded, and the
// server closes the connection.
func (pc *proxyConn) startup() bool {
	msg, err := pc.be.ReceiveStartupMessage()
	if _, ok := msg.(*pgproto3.SSLRequest); ok { // refused: the client goes on in the clear
		if _, err = pc.c.Write([]byte{'N'}); err == nil {
			msg, err = pc.be.ReceiveStartupMessage()
		}
	}
	if _, ok := msg.(*pgproto3.CancelRequest); ok {
		pc.p.mu.Lock()
		drop := pc.p.dropCancels
		pc.p.mu.Unlock()
		if drop {
			return false
		}
	}
	if err != nil || !pc.toServer(msg) {
		return false
	}
	for {
		msg, err := pc.fe.Receive()
		if err != nil || !pc.toClient(msg) {
			return false
		}
		switch msg.(type) {
		case *pgproto3.ReadyForQuery:
			return true
		case *pgproto3.AuthenticationCleartextPassword, *pgproto3.AuthenticationMD5Password,
			*pgproto3.AuthenticationSASL, *pgproto3.AuthenticationSASLContinue:
			// The client answers; its answer's type depends on the method.
			if pc.be.SetAuthType(pc.fe.GetAuthType()) != nil {
				return false
			}
			if resp, err := pc.be.Receive(); err != nil || !pc.toServer(resp) {
				return false
			}
		}
	}
}

// up forwards the client's messages, noting requests that execute a matching statement.
func (pc *proxyConn) up() {
	defer pc.close()
	p := pc.p
	unnamed := false // the unnamed prepared statement's SQL contains match
	for {
		msg, err := pc.be.Receive()
		if err != nil {
			return
		}
		p.mu.Lock()
		matches := func(sql string) bool { return p.match != "" && strings.Contains(sql, p.match) }
		switch m := msg.(type) {
		case *pgproto3.Parse:
			if m.Name == "" {
				unnamed = matches(m.Query)
			} else if matches(m.Query) {
				p.named[m.Name] = true
			}
		case *pgproto3.Bind:
			if p.armed && (p.named[m.PreparedStatement] || (m.PreparedStatement == "" && unnamed)) {
				pc.pending.Store(true)
			}
		case *pgproto3.Query:
			if p.armed && matches(m.String) {
				pc.pending.Store(true)
			}
		}
		var gate chan struct{}
		if sql := queryOf(msg); p.hold != "" && strings.Contains(sql, p.hold) {
			p.hold, gate = "", p.gate
			close(p.held)
		}
		p.mu.Unlock()
		if gate != nil {
			<-gate
		}
		if !pc.toServer(msg) {
			return
		}
	}
}

// queryOf is the SQL of a Parse or Query message, else "".
func queryOf(msg pgproto3.FrontendMessage) string {
	switch m := msg.(type) {
	case *pgproto3.Parse:
		return m.Query
	case *pgproto3.Query:
		return m.String
	}
	return ""
}

// down forwards the server's messages, except the reply it was armed to lose. The reply
// to a matching request is held (in be's send buffer) until its ReadyForQuery.
func (pc *proxyConn) down() {
	defer pc.close()
	p := pc.p
	sawMarker := false
	for {
		msg, err := pc.fe.Receive()
		if err != nil {
			return
		}
		pc.be.Send(msg) // sent on Flush
		if pc.pending.Load() {
			p.mu.Lock()
			row, isRow := msg.(*pgproto3.DataRow)
			sawMarker = sawMarker || isRow && p.marker != nil &&
				slices.ContainsFunc(row.Values, func(v []byte) bool { return bytes.Contains(v, p.marker) })
			_, ready := msg.(*pgproto3.ReadyForQuery)
			if ready && p.armed && (p.marker == nil || sawMarker) {
				p.armed = false
				close(p.killed)
				if p.cutOnKill {
					p.cutLocked()
				}
				p.mu.Unlock()
				return // committed; the client never hears of it
			}
			p.mu.Unlock()
			if !ready {
				continue
			}
			pc.pending.Store(false)
			sawMarker = false
		}
		if pc.be.Flush() != nil {
			return
		}
	}
}

// recordingConnector answers every delivery with success and remembers each.
type recordingConnector struct {
	mu  sync.Mutex
	got map[string][]connectors.Delivery
}

func (c *recordingConnector) Deliver(_ context.Context, d connectors.Delivery) (json.RawMessage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.got == nil {
		c.got = map[string][]connectors.Delivery{}
	}
	c.got[d.Key] = append(c.got[d.Key], d)
	return json.RawMessage(`{"ok":true}`), nil
}

func (c *recordingConnector) Guarantee() connectors.Guarantee { return connectors.Enforced }

func (c *recordingConnector) deliveries(key string) []connectors.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got[key])
}

// lossySetup is a fresh database, a pool on it for the test, a lossy proxy to it, and a
// relay config on an injected clock (a minute ahead of the database, so rows are due;
// it never moves, so no lease expires during the test).
func lossySetup(t *testing.T) (direct *pgxpool.Pool, proxy *lossyProxy, cfg *Config, clock *testClock) {
	t.Helper()
	dsn := pgtest.URL(t)
	direct, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	proxy = startLossyProxy(t, dsn)
	var dbNow time.Time
	require.NoError(t, direct.QueryRow(t.Context(), `SELECT now()`).Scan(&dbNow))
	clock = &testClock{now: dbNow.Add(time.Minute)}
	cfg = &Config{PollInterval: 50 * time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond,
		Registerer: prometheus.NewRegistry(), Logger: testLogger(), NowFunc: clock.Now}
	return direct, proxy, cfg, clock
}

// lostClaimThenAfter enqueues "lost-claim", whose claim's reply the proxy (armed for it)
// loses, then "after", and requires both delivered, the lost claim in one attempt: the
// relay goes on after the lost round, and hands its row back uncounted.
func lostClaimThenAfter(t *testing.T, direct *pgxpool.Pool, proxy *lossyProxy) {
	t.Helper()
	enqueue(t, direct, "lost-claim", "webhook", map[string]int{"n": 1})
	// The claim committed: the proxy lost a reply holding the row, read up to its
	// ReadyForQuery. (Its status is not looked at here: the relay may already have
	// handed the row back, or delivered it, by the time the test would read it.)
	waitKilled(t, proxy)
	enqueue(t, direct, "after", "webhook", map[string]int{"n": 2})
	waitStatus(t, direct, "after", outbox.StatusDelivered)
	in := waitStatus(t, direct, "lost-claim", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts, "the claim that was never started is not counted")
}

func waitKilled(t *testing.T, p *lossyProxy) {
	t.Helper()
	select {
	case <-p.killed:
	case <-time.After(waitTimeout):
		t.Fatal("the proxy never lost the reply it was armed for")
	}
}

// A round's claim commits, and the connection drops before its reply arrives. The rows
// it claimed are leased to this relay in the database, but the relay never saw them:
// they must be handed back and sent at once, as the attempt they were claimed for, not
// left until their lease expires and then retried as an ambiguous attempt (held for an
// operator, or dead on a last attempt) although they were never sent.
func TestLostClaimReplyHandsTheRowsBack(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	conn := &recordingConnector{}
	proxy.arm("SET status = 'delivering'", []byte("lost-claim"))
	start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})

	// Without the fix, the row claimed in the lost round stays leased, unsent, until its
	// lease expires, which the tests' clock never reaches.
	lostClaimThenAfter(t, direct, proxy)
	got := conn.deliveries("lost-claim")
	require.Len(t, got, 1)
	require.Equal(t, 1, got[0].Attempt)
	require.False(t, got[0].PreviousAmbiguous)
	att := attemptsOf(t, direct, "lost-claim")
	require.Len(t, att, 1)
	require.Equal(t, "delivered", att[0].Outcome)
	require.False(t, att[0].Ambiguous)
}

// A round's outcomes commit, and the connection drops before its reply arrives. The
// relay writes them again, not knowing; the attempt must still be logged once.
func TestLostOutcomeReplyLogsTheAttemptOnce(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	conn := &recordingConnector{}
	proxy.arm("AS t(id, attempt, status", nil) // recordSQL
	start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})

	enqueue(t, direct, "once", "webhook", map[string]int{"n": 1})
	waitKilled(t, proxy)
	in, err := outbox.Get(t.Context(), direct, "once")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status, "the outcome committed")

	// The outcome the relay still holds is written no later than the next one.
	enqueue(t, direct, "after", "webhook", map[string]int{"n": 2})
	waitStatus(t, direct, "after", outbox.StatusDelivered)
	require.Eventually(t, func() bool { return len(attemptsOf(t, direct, "after")) > 0 }, waitTimeout, 10*time.Millisecond)

	require.Len(t, conn.deliveries("once"), 1)
	att := attemptsOf(t, direct, "once")
	require.Len(t, att, 1, "attempts log: %+v", att)
	require.Equal(t, "delivered", att[0].Outcome)
}

// gatedConnector declares a time limit (so rows are claimed ahead of its workers),
// records every delivery and holds the first until gate is closed.
type gatedConnector struct {
	recordingConnector
	once    sync.Once
	first   chan string // the key of the first delivery, once it started
	gate    chan struct{}
	timeout time.Duration
}

func newGatedConnector() *gatedConnector {
	return &gatedConnector{first: make(chan string, 1), gate: make(chan struct{}), timeout: time.Second}
}

func (c *gatedConnector) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	isFirst := false
	c.once.Do(func() { isFirst = true })
	res, err := c.recordingConnector.Deliver(ctx, d)
	if isFirst {
		c.first <- d.Key
		<-c.gate
	}
	return res, err
}

func (c *gatedConnector) Timeout() time.Duration { return c.timeout }

// waitFirst waits until the first delivery has started, and returns its key.
func (c *gatedConnector) waitFirst(t *testing.T) string {
	t.Helper()
	select {
	case k := <-c.first:
		return k
	case <-time.After(waitTimeout):
		t.Fatal("nothing was delivered")
		return ""
	}
}

// signalHandler is a slog handler that closes seen when a record's message contains
// want.
type signalHandler struct {
	want string
	once *sync.Once
	seen chan struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.want) {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitTimeout):
		t.Fatal(what)
	}
}

// deliverOneOfTwo enqueues rows a and b for a relay with one worker and a gated
// connector: it returns the row whose delivery started (and waits at the gate) and the
// other, claimed ahead and waiting for the worker.
func deliverOneOfTwo(t *testing.T, direct *pgxpool.Pool, r *Relay, conn *gatedConnector) (first, second string) {
	t.Helper()
	_, err := outbox.EnqueueBatch(t.Context(), direct, []outbox.Message{
		{Key: "a", Connector: "webhook", Payload: []int{1}},
		{Key: "b", Connector: "webhook", Payload: []int{2}},
	})
	require.NoError(t, err)
	first = conn.waitFirst(t)
	second = map[string]string{"a": "b", "b": "a"}[first]
	require.Eventually(t, func() bool { return r.claimedRows.Load() == 2 }, waitTimeout, time.Millisecond, "both rows claimed")
	return first, second
}

// A row claimed ahead waits too long for its worker while the database is down, and is
// handed back; the release fails. It was never sent, so it must be released once the
// database answers again, not left leased until its lease expires and then retried as
// an ambiguous attempt (held for an operator, or dead when it was the last one).
func TestFailedHandBackIsReleasedWhenTheDatabaseReturns(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	released := make(chan struct{})
	cfg.Logger = slog.New(signalHandler{want: "could not release unstarted rows", once: &sync.Once{}, seen: released})
	cfg.Concurrency = 1 // one worker: the second row waits for it
	conn := newGatedConnector()
	r, _ := start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})

	first, second := deliverOneOfTwo(t, direct, r, conn)

	// The database goes away; the waiting row is past its start-by time when the worker
	// comes to it, and its release fails.
	proxy.cut()
	clock.Advance(r.instances["webhook"].startBy + time.Second)
	close(conn.gate)
	waitFor(t, released, "the handed-back row's release never failed")
	proxy.restore()

	waitStatus(t, direct, first, outbox.StatusDelivered)
	// Without the fix, the handed-back row stays leased, unsent, until its lease expires,
	// which the tests' clock never reaches.
	in := waitStatus(t, direct, second, outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts)
	got := conn.deliveries(second)
	require.Len(t, got, 1)
	require.False(t, got[0].PreviousAmbiguous)
	att := attemptsOf(t, direct, second)
	require.Len(t, att, 1)
	require.Equal(t, "delivered", att[0].Outcome)
}

// The database is unreachable for longer than the lease while a delivery is in flight;
// another relay puts the row back as ambiguous. When the database returns, the outcome
// the relay held in memory is written as the attempt's late outcome.
func TestOutcomeHeldThroughAnOutageLongerThanTheLease(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	cfg.Concurrency = 1
	conn := newGatedConnector()
	r, _ := start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	enqueue(t, direct, "late", "webhook", []int{1})
	conn.waitFirst(t)

	proxy.cut()
	clock.Advance(r.cfg.Lease + time.Second)
	oc := *cfg
	oc.ID, oc.Registerer = "other", prometheus.NewRegistry()
	other, err := New(direct, &oc, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	other.reclaim(t.Context())
	in, err := outbox.Get(t.Context(), direct, "late")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
	require.Contains(t, in.LastError, "lost its lease")

	// The attempt ends while the database is away; its outcome waits in memory.
	failed := testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim"))
	close(conn.gate)
	require.Eventually(t, func() bool { return r.claimedRows.Load() == 0 }, waitTimeout, time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim")) >= failed+2 },
		waitTimeout, time.Millisecond, "rounds fail while the database is away")
	proxy.restore()

	in = waitStatus(t, direct, "late", outbox.StatusDelivered)
	var ambiguous bool
	require.NoError(t, direct.QueryRow(t.Context(), `SELECT ambiguous FROM outbox WHERE idempotency_key = 'late'`).Scan(&ambiguous))
	require.False(t, ambiguous)
	require.Equal(t, 1, in.Attempts)
	require.Len(t, conn.deliveries("late"), 1)
	att := attemptsOf(t, direct, "late")
	require.Len(t, att, 2)
	require.Equal(t, "lease_expired", att[0].Outcome)
	require.Equal(t, "delivered", att[1].Outcome)
}

// A hand-back whose release committed but whose reply was lost is tried again before a
// later round (releaseAgain). By then the row may have been claimed again, by the same
// attempt number, and given to a worker: the retried release must leave that newer
// claim alone, or the row goes back to pending while it is being sent, and another
// relay sends it too.
func TestRetriedReleaseLeavesANewerClaimAlone(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	enqueue(t, direct, "twice", "webhook", []int{1})
	first := claimRows(t, r, "webhook")
	require.Len(t, first, 1)

	proxy.arm("AS r(id, attempt", nil) // releaseSQL
	r.release(t.Context(), first)
	waitKilled(t, proxy)
	require.True(t, r.anyUnreleased.Load(), "the release is to be tried again")
	in, err := outbox.Get(t.Context(), direct, "twice")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status, "the release committed")

	// The next round claims the row again, for the same attempt, and a worker has it.
	again := claimRows(t, r, "webhook")
	require.Len(t, again, 1)
	require.Equal(t, first[0].attempt, again[0].attempt)

	r.releaseAgain(t.Context()) // the claim loop, before its next round
	in, err = outbox.Get(t.Context(), direct, "twice")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "the newer claim, in a worker's hands, stands")
}

// salvage writes a refused outcome alone, without its answer. When that write commits
// and its reply is lost, the outcome is written again: it must be written with
// recordAgainSQL, so that the attempt is logged once.
func TestSalvagedOutcomeWrittenAgainIsLoggedOnce(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: &recordingConnector{}}})
	require.NoError(t, err)
	o := claimedOutcome(t, r, direct, clock, "salvaged")

	proxy.arm("AS t(id, attempt, status", nil) // recordSQL
	left := r.salvage(t.Context(), []outcome{o}, errors.New("refused"))
	waitKilled(t, proxy)
	require.Len(t, left, 1, "the write's fate is unknown: it is retried")
	r.writeOutcomes(t.Context(), left)

	in, err := outbox.Get(t.Context(), direct, "salvaged")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status)
	att := attemptsOf(t, direct, "salvaged")
	require.Len(t, att, 1, "attempts log: %+v", att)
}

// claimedOutcome enqueues key, has r claim it, and returns the outcome of its attempt,
// delivered at clock's time, for a test to write.
func claimedOutcome(t *testing.T, r *Relay, db outbox.DB, clock *testClock, key string) outcome {
	t.Helper()
	enqueue(t, db, key, "webhook", []int{1})
	got := claimRows(t, r, "webhook")
	require.Len(t, got, 1)
	now := clock.Now()
	return outcome{id: got[0].id, attempt: got[0].attempt, status: statusDelivered, result: []byte(`{"ok":true}`),
		started: now, finished: now, record: statusDelivered}
}

// refusingGatedConnector is a gatedConnector whose receiver refuses every request for
// good (a 400): a row's first attempt is its last.
type refusingGatedConnector struct{ *gatedConnector }

func (c refusingGatedConnector) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	_, _ = c.gatedConnector.Deliver(ctx, d)
	return nil, connectors.Permanent(errors.New("400 Bad Request"))
}

// The database is unreachable for longer than the lease while a delivery is in flight,
// and the relay is alone: when the database returns, its own reclaim finds the row's
// lease expired. But the attempt ended, and the relay holds its outcome (here a
// permanent refusal) until the claim loop writes it: putting the row back as an
// abandoned, ambiguous attempt threw that answer away, and the row was sent again (held
// for an operator with the hold policy; sent before the receiver's Retry-After).
func TestOwnReclaimLeavesARowWhoseOutcomeItHolds(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, clock := lossySetup(t)
	cfg.Concurrency = 1
	conn := newGatedConnector()
	r, _ := start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: refusingGatedConnector{conn}}})
	enqueue(t, direct, "refused", "webhook", []int{1})
	conn.waitFirst(t)

	proxy.cut()
	clock.Advance(r.cfg.Lease + time.Second)
	// The attempt ends while the database is away; its outcome waits in memory.
	failed := testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim"))
	close(conn.gate)
	require.Eventually(t, func() bool { return r.claimedRows.Load() == 0 }, waitTimeout, time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim")) >= failed+2 },
		waitTimeout, time.Millisecond, "rounds fail while the database is away")
	// The database returns; the round that writes the outcome is held on its way, and
	// the relay's reclaim runs first.
	held, release := proxy.holdOnce(t, "AS t(id, attempt, status")
	proxy.restore()
	waitFor(t, held, "the outcome was never written again")
	r.reclaim(t.Context())
	in, err := outbox.Get(t.Context(), direct, "refused")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivering, in.Status, "reclaim took a row whose outcome the relay holds: %s", in.LastError)

	release()
	in = waitStatus(t, direct, "refused", outbox.StatusDead)
	require.Equal(t, 1, in.Attempts)
	require.Len(t, conn.deliveries("refused"), 1, "sent once")
	att := attemptsOf(t, direct, "refused")
	require.Len(t, att, 1, "attempts log: %+v", att)
	require.Equal(t, "dead", att[0].Outcome)
}
