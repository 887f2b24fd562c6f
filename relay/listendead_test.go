package relay

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// blackholeProxy forwards TCP on loopback to PostgreSQL. dropListen makes the LISTEN
// connections open through it black holes, as a NAT gateway or load balancer that forgot
// an idle connection does: what either side sends is lost, and neither hears a reset.
// The other connections, and those made after, pass through.
type blackholeProxy struct {
	ln     net.Listener
	target string
	pool   *pgxpool.Pool // a pool through the proxy

	mu    sync.Mutex
	pairs []*proxyPair
	conns []net.Conn
}

// proxyPair is one connection through a blackholeProxy.
type proxyPair struct {
	listen  atomic.Bool // the client sent LISTEN on it
	dropped atomic.Bool
}

func startBlackholeProxy(t *testing.T, direct *pgxpool.Pool) *blackholeProxy {
	t.Helper()
	cfg := direct.Config().Copy()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{ln: ln, target: net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.TLSConfig = nil
	cfg.ConnConfig.Fallbacks = nil
	p.pool, err = pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.pool.Close)
	return p
}

func (p *blackholeProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		pair := &proxyPair{}
		p.mu.Lock()
		p.pairs = append(p.pairs, pair)
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		go pair.pump(client, server, false)
		go pair.pump(server, client, true)
	}
}

// pump copies from src to dst until src ends, losing what it reads once dropped.
func (pair *proxyPair) pump(dst io.WriteCloser, src io.Reader, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if fromClient && bytes.Contains(buf[:n], []byte("LISTEN "+notifyChannel)) {
			pair.listen.Store(true)
		}
		if n > 0 && !pair.dropped.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !pair.dropped.Load() {
				_ = dst.Close()
			}
			return
		}
	}
}

// dropListen makes the LISTEN connections open now black holes.
func (p *blackholeProxy) dropListen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pair := range p.pairs {
		if pair.listen.Load() {
			pair.dropped.Store(true)
		}
	}
}

// A LISTEN connection that died without a reset (a NAT gateway or load balancer that
// dropped it while no notification came, the old primary's host gone after a failover)
// delivers nothing and reports nothing until TCP keepalive gives up, most of an hour
// with pgx's defaults. It was never looked at: /readyz said LISTEN was up and
// outboxd_notify_working said 1 while no NOTIFY woke the relay, and rows waited for
// the poll. A LISTEN connection silent for a while is now pinged, and made again when
// the ping gets no answer.
func TestDeadListenConnectionIsFoundAndMadeAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	proxy := startBlackholeProxy(t, b.pool)
	lost := make(chan struct{})
	cfg := b.fastConfig()
	cfg.PollInterval = time.Hour // only NOTIFY wakes it
	cfg.Logger = slog.New(signalHandler{want: listenLost, once: &sync.Once{}, seen: lost})
	r, err := New(proxy.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	r.probeTimeout = waitTimeout
	r.listenCheck = 500 * time.Millisecond
	run(t, r)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond)

	proxy.dropListen()
	waitFor(t, lost, "the dead LISTEN connection was never found: /readyz said LISTEN was up")
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond,
		"LISTEN again on a new connection")
	enqueue(t, b.pool, "after", "webhook", []int{1})
	waitStatus(t, b.pool, "after", outbox.StatusDelivered) // woken by its NOTIFY
}
