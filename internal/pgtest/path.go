package pgtest

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Path is a network path to a test database: a loopback TCP proxy that a test can break
// the ways networks break. Cut closes its connections (with a reset or not), DropReplies
// loses what the database sends, and BlackHole makes the connections on which the client
// sent what Watch looks for lose everything without a word, as a NAT gateway or load
// balancer that forgot them does.
type Path struct {
	ln      net.Listener
	target  string
	dropped atomic.Bool            // DropReplies
	watch   atomic.Pointer[[]byte] // Watch

	mu    sync.Mutex
	links []*link
	wg    sync.WaitGroup
}

// link is one connection through a Path.
type link struct {
	client, server *net.TCPConn
	sent           atomic.Bool // the client sent what the Path watches for
	dead           atomic.Bool // a black hole
}

// NewPath starts a Path to pool's server, stopped when the test ends.
func NewPath(t testing.TB, pool *pgxpool.Pool) *Path {
	t.Helper()
	cc := pool.Config().ConnConfig
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Path{ln: ln, target: net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut(false)
		p.wg.Wait()
	})
	return p
}

func (p *Path) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c.(*net.TCPConn), server: s.(*net.TCPConn)}
		p.mu.Lock()
		p.links = append(p.links, l)
		p.mu.Unlock()
		p.wg.Go(func() { p.pump(l, l.server, l.client) })
		p.wg.Go(func() { p.pump(l, l.client, l.server) })
	}
}

// pump copies from src to dst until src ends, losing what it reads while dst should not
// hear it. A link that became a black hole does not pass the end on either.
func (p *Path) pump(l *link, dst, src *net.TCPConn) {
	fromServer := src == l.server
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if w := p.watch.Load(); !fromServer && w != nil && bytes.Contains(buf[:n], *w) {
			l.sent.Store(true)
		}
		if n > 0 && !l.dead.Load() && !(fromServer && p.dropped.Load()) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !l.dead.Load() {
				_ = dst.Close()
			}
			return
		}
	}
}

// Addr is the Path's host:port.
func (p *Path) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection through the Path, with a reset (RST) when reset is true.
// New connections pass.
func (p *Path) Cut(reset bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		for _, c := range []*net.TCPConn{l.client, l.server} {
			if reset {
				_ = c.SetLinger(0)
			}
			_ = c.Close()
		}
	}
	p.links = nil
}

// DropReplies loses, while on, everything the database sends on every connection.
func (p *Path) DropReplies(on bool) { p.dropped.Store(on) }

// Watch notes, from now on, the connections on which the client sends match (within
// one read), for BlackHole.
func (p *Path) Watch(match string) {
	m := []byte(match)
	p.watch.Store(&m)
}

// BlackHole makes the connections open now on which the client sent what Watch looks
// for black holes: what either side sends is lost, and neither hears a reset.
func (p *Path) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		if l.sent.Load() {
			l.dead.Store(true)
		}
	}
}

// Pool opens a pool on base's database through p, as base's configuration says and then
// as each of opts changes it (see OneUnpingedSession). Closed when the test ends.
func (p *Path) Pool(t testing.TB, base *pgxpool.Pool, opts ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg := base.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(p.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// OneUnpingedSession makes a pool of one session that is never pinged before it is
// handed out, as in a busy pool: a request takes a session whose path was cut as it is.
func OneUnpingedSession(cfg *pgxpool.Config) {
	cfg.MaxConns = 1
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
}
