package pgtest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Hook is a pgx query tracer that runs Func once, when armed, right after the first
// statement whose SQL Match accepts ends: a test injects a concurrent change (a purge, a
// late delivery) at an exact point between the statements of the code it tests, with no
// sleeps. Func runs on the goroutine of the code under test, so it must not call
// t.FailNow (require); it keeps its errors for the test to check.
type Hook struct {
	Match func(sql string) bool
	Func  func()
	armed atomic.Bool
}

// After is a Hook running f after the first statement containing text.
func After(text string, f func()) *Hook {
	return &Hook{Match: func(sql string) bool { return strings.Contains(sql, text) }, Func: f}
}

// Arm makes the hook run after the next matching statement.
func (h *Hook) Arm() { h.armed.Store(true) }

// Ran says the hook ran since it was last armed.
func (h *Hook) Ran() bool { return !h.armed.Load() }

type hookKey struct{}

// TraceQueryStart implements pgx.QueryTracer.
func (h *Hook) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if h.Match(data.SQL) {
		return context.WithValue(ctx, hookKey{}, true)
	}
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (h *Hook) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(hookKey{}) != nil && h.armed.CompareAndSwap(true, false) {
		h.Func()
	}
}

// PoolWith is a pool on pool's database whose connections run h, closed when the test
// ends.
func PoolWith(t testing.TB, pool *pgxpool.Pool, h *Hook) *pgxpool.Pool {
	t.Helper()
	return poolWith(t, pool, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = h })
}

// poolWith is a pool on pool's database with its configuration changed by set, closed
// when the test ends.
func poolWith(t testing.TB, pool *pgxpool.Pool, set func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	set(cfg)
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}
