package mcpserver_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/mcpserver"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// A session lost after the database committed the proposal but before its answer came
// back (a proxy or pooler restarted, a failover that resets connections) is the database
// out of reach, as one that is down; but the intent was written: the tool error must not
// tell the agent that nothing was, which it may take as the effect not happening.
func TestMCPSessionLostAfterCommitDoesNotSayNothingWasWritten(t *testing.T) {
	t.Parallel()
	direct := pgtest.DB(t)
	path := newReplyHoldingProxy(t, direct)
	pool := proxiedPool(t, direct, path.ln.Addr().String())
	b := &testBundle{pool: pool, svc: &intent.Service{Pool: pool, Policy: testPolicy()}}
	cs := b.connect(t, "agent")
	// The pool holds a session through the path that has prepared the proposal's
	// statement, so the next proposal is one round trip.
	ok[mcpserver.ProposeOutput](t, call(t, cs, mcpserver.ToolPropose, map[string]any{
		"connector": "webhook", "key": "warm-1", "payload": map[string]any{},
	}))

	path.hold.Store(true) // the database's answers go no further
	res := make(chan string, 1)
	go func() {
		r, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: mcpserver.ToolPropose, Arguments: map[string]any{
			"connector": "webhook", "key": "lost-1", "payload": map[string]any{},
		}})
		if err != nil {
			res <- err.Error()
			return
		}
		res <- text(r)
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, direct.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE idempotency_key = 'lost-1'`).Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the proposal commits")
	path.cut()

	msg := <-res
	require.Contains(t, msg, "database is unavailable")
	require.NotContains(t, msg, "nothing was written")
	require.Contains(t, msg, `same key "lost-1"`)
}

// replyHoldingProxy is a network path to a database: a loopback TCP proxy that stops
// passing the database's answers on while hold is set, and whose connections can be cut.
type replyHoldingProxy struct {
	ln    net.Listener
	hold  atomic.Bool
	mu    sync.Mutex
	conns []*net.TCPConn
	wg    sync.WaitGroup
}

func newReplyHoldingProxy(t *testing.T, pool *pgxpool.Pool) *replyHoldingProxy {
	t.Helper()
	cc := pool.Config().ConnConfig
	target := net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &replyHoldingProxy{ln: ln}
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
			p.wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && !p.hold.Load() {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

// cut resets every connection through the proxy.
func (p *replyHoldingProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
	p.conns = nil
}

// proxiedPool opens a pool of one session on base's database through addr that never
// pings a session before handing it out, as in a busy pool. Closed when the test ends.
func proxiedPool(t *testing.T, base *pgxpool.Pool, addr string) *pgxpool.Pool {
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
