package api_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// A session lost on the way (a pooler or a proxy restarted, a failover that resets the
// connections, a host gone) fails the request's statement with an EOF or a reset, not
// with PostgreSQL's 57P01: the database is out of reach all the same, and the client
// must hear 503, which it retries, rather than 500 "internal error", which reads as a
// fault of the server or the request.
func TestDatabaseConnectionLostIs503(t *testing.T) {
	t.Parallel()
	for _, reset := range []bool{false, true} { // closed (EOF), or reset (RST)
		t.Run("reset="+strconv.FormatBool(reset), func(t *testing.T) {
			t.Parallel()
			base := pgtest.DB(t)
			path := newPathProxy(t, base)
			pool := pathPool(t, base, path.addr())
			b := serveAPI(t, pool, adminService(pool), nil)

			for _, c := range []struct{ method, path, body string }{
				{"POST", "/v1/intents", `{"connector":"webhook","payload":{}}`},
				{"GET", "/v1/intents/k-1", ""},
				{"GET", "/v1/intents", ""},
				{"POST", "/v1/intents/k-1/cancel", ""},
			} {
				require.NoError(t, pool.Ping(t.Context())) // the pool holds a session
				path.cut(reset)

				r := b.do(t, c.method, c.path, adminSecret, "k-1", c.body)
				requireUnavailable(t, r, c.method+" "+c.path)
			}
			// The pool dropped the lost session: the same request again works.
			r := b.do(t, "POST", "/v1/intents", adminSecret, "k-1", `{"connector":"webhook","payload":{}}`)
			require.Equal(t, 201, r.status, r.raw)
		})
	}
}

// pathProxy is a network path to a database: a loopback TCP proxy whose connections
// can be cut.
type pathProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
	wg    sync.WaitGroup
}

// newPathProxy starts a proxy to pool's server, stopped when the test ends.
func newPathProxy(t *testing.T, pool *pgxpool.Pool) *pathProxy {
	t.Helper()
	cc := pool.Config().ConnConfig
	target := net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pathProxy{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c.(*net.TCPConn), s.(*net.TCPConn))
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
			p.wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut(false)
		p.wg.Wait()
	})
	return p
}

func (p *pathProxy) addr() string { return p.ln.Addr().String() }

// cut closes every connection through the proxy, with a reset (RST) when reset is true.
func (p *pathProxy) cut(reset bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if reset {
			_ = c.SetLinger(0)
		}
		_ = c.Close()
	}
	p.conns = nil
}

// pathPool opens a pool of one session on base's database through addr, a pathProxy,
// that never pings a session before handing it out, as in a busy pool: a request takes
// a session whose path was cut as it is. Closed when the test ends.
func pathPool(t *testing.T, base *pgxpool.Pool, addr string) *pgxpool.Pool {
	t.Helper()
	cfg := base.Config().Copy()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(n), nil
	cfg.MaxConns = 1
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
