package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// OneSessionPool opens a pool of one session on pool's database that never pings a
// session before handing it out, as in a busy pool whose sessions are each used within
// pgxpool's 1s before it pings one: a caller takes a session the server ended as it is.
// The pool is closed when the test ends.
func OneSessionPool(t testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	cfg.MaxConns = 1
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	one, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(one.Close)
	return one
}

// EndSession has the server end (pg_terminate_backend, SQLSTATE 57P01) the session one,
// a pool from OneSessionPool, holds, through admin, a pool on the same server, and waits
// up to 10s for it to end.
func EndSession(t testing.TB, admin, one *pgxpool.Pool) {
	t.Helper()
	var pid uint32
	require.NoError(t, one.AcquireFunc(t.Context(), func(c *pgxpool.Conn) error {
		pid = c.Conn().PgConn().PID()
		return nil
	}))
	var ended bool
	require.NoError(t, admin.QueryRow(t.Context(), `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ended))
	require.True(t, ended)
}
