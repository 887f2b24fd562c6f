package api_test

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// A session lost on the way (a pooler or a proxy restarted, a failover that resets the
// connections, a host gone) fails the request's statement with an EOF or a reset, not
// with PostgreSQL's 57P01: the database is out of reach all the same, and the client
// must hear 503, which it retries, rather than 500 "internal error", which reads as a
// fault of the server or the request. So in every query exec mode: behind a
// transaction pooler (simple protocol or exec), pgx reports the lost session of a
// statement it sent as "conn closed" (pgconn.ErrConnClosed), which answered 500.
func TestDatabaseConnectionLostIs503(t *testing.T) {
	t.Parallel()
	for _, mode := range append([]pgx.QueryExecMode{pgx.QueryExecModeCacheStatement}, pgtest.ExecModes...) {
		for _, reset := range []bool{false, true} { // closed (EOF), or reset (RST)
			t.Run(mode.String()+"/reset="+strconv.FormatBool(reset), func(t *testing.T) {
				t.Parallel()
				testDatabaseConnectionLostIs503(t, mode, reset)
			})
		}
	}
}

func testDatabaseConnectionLostIs503(t *testing.T, mode pgx.QueryExecMode, reset bool) {
	base := pgtest.DB(t)
	path := pgtest.NewPath(t, base)
	pool := path.Pool(t, base, pgtest.OneUnpingedSession, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = mode
	})
	b := serveAPI(t, pool, adminService(pool), nil)

	for _, c := range databaseCalls {
		require.NoError(t, pool.Ping(t.Context())) // the pool holds a session
		path.Cut(reset)

		r := b.do(t, c.method, c.path, adminSecret, "k-1", c.body)
		requireUnavailable(t, r, c.method+" "+c.path)
	}
	// The pool dropped the lost session: the same request again works.
	r := b.do(t, "POST", "/v1/intents", adminSecret, "k-1", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, 201, r.status, r.raw)
}
