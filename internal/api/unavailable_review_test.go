package api_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/api"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A database that accepts connections but never answers (a hung server, a stalled
// network path) must give the client an answer within Config.CallTimeout, not a request
// that never ends: pgx has no deadline of its own, and the HTTP server's write timeout
// does not end a handler that waits.
func TestDatabaseNotAnsweringIs503(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://app:hunter2@"+pgtest.UnansweringAddr(t)+"/app")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := serveAPI(t, pool, adminService(pool), &api.Config{CallTimeout: 100 * time.Millisecond})

	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/intents", `{"connector":"webhook","payload":{}}`},
		{"GET", "/v1/intents/k-1", ""},
		{"GET", "/v1/intents", ""},
		{"POST", "/v1/intents/k-1/approve", ""},
	} {
		req, err := http.NewRequestWithContext(t.Context(), c.method, b.url+c.path, strings.NewReader(c.body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+adminSecret)
		req.Header.Set("Idempotency-Key", "k-1")
		// The bound is the test's, far above CallTimeout: without one the request would
		// wait for ever.
		res, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		require.NoError(t, err, c.path)
		raw, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "%s %s: %s", c.method, c.path, raw)
		require.Contains(t, string(raw), "did not answer")
		require.NotContains(t, string(raw), "hunter2")
	}
}

// A database that refuses connections is a 503 that says so, without the connection's
// details: not a 500 "internal error", which reads as a fault of the server or the request.
func TestDatabaseDownIs503(t *testing.T) {
	t.Parallel()
	addr := pgtest.UnreachableAddr(t)
	pool, err := pgxpool.New(t.Context(), "postgres://app:hunter2@"+addr+"/app")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := serveAPI(t, pool, adminService(pool), nil)

	for _, c := range databaseCalls {
		r := b.do(t, c.method, c.path, adminSecret, "k-1", c.body)
		requireUnavailable(t, r, c.method+" "+c.path)
		require.NotContains(t, r.raw, "hunter2")
		require.NotContains(t, r.raw, addr)
	}
}

// A database that ends the sessions the pool holds (a restart, a failover: PostgreSQL
// says "terminating connection due to administrator command", SQLSTATE 57P01) is a 503
// that says so, as when it is down: not a 500 "internal error" for each pooled session
// the next request happens to take.
func TestDatabaseEndedSessionIs503(t *testing.T) {
	t.Parallel()
	admin := pgtest.DB(t)
	// The request takes the ended session as it is, as in a busy relay's pool.
	pool := pgtest.OneSessionPool(t, admin)
	b := serveAPI(t, pool, adminService(pool), nil)

	for _, c := range databaseCalls {
		pgtest.EndSession(t, admin, pool)

		r := b.do(t, c.method, c.path, adminSecret, "k-1", c.body)
		requireUnavailable(t, r, c.method+" "+c.path)
	}
}

// A database that takes no writes (a hot standby the pool reached after a failover, a
// primary demoted or set default_transaction_read_only: SQLSTATE 25006) is a 503 that
// says so: not a 500 "internal error", which reads as a fault of the server or the
// request, when the same request sent again once writes work is safe.
func TestDatabaseReadOnlyIs503(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := outbox.Enqueue(t.Context(), pool, outbox.Message{Key: "k-1", Connector: "webhook", Payload: []byte(`{}`)})
	require.NoError(t, err)
	ro := poolWith(t, pool, map[string]string{"default_transaction_read_only": "on"})
	b := serveAPI(t, ro, adminService(ro), nil)

	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/intents", `{"connector":"webhook","payload":{}}`},
		{"POST", "/v1/intents/k-1/cancel", ""},
	} {
		r := b.do(t, c.method, c.path, adminSecret, "k-2", c.body)
		requireUnavailable(t, r, c.method+" "+c.path)
	}
}

// A transaction PostgreSQL ends to resolve a conflict with concurrent work (a
// serialization failure, SQLSTATE 40001, or a deadlock, 40P01) wrote nothing, and the
// same request sent again is safe and may well succeed: a 503 that says so, not a 500
// "internal error", which reads as a fault of the server or the request. Here a database
// whose default isolation is REPEATABLE READ, and two decisions on one intent at once:
// the approval waits for the other's lock, and PostgreSQL fails it once the other commits.
func TestSerializationFailureIs503(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := outbox.Enqueue(ctx, pool, outbox.Message{Key: "k-1", Connector: "webhook", Payload: []byte(`{}`), RequireApproval: true})
	require.NoError(t, err)
	rr := poolWith(t, pool, map[string]string{
		"default_transaction_isolation": "repeatable read", "application_name": "serialization_test_api"})
	b := serveAPI(t, rr, adminService(rr), nil)

	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Rollback(context.WithoutCancel(ctx)) })
	_, err = other.Exec(ctx, `UPDATE outbox SET updated_at = now() WHERE idempotency_key = 'k-1'`)
	require.NoError(t, err)
	answer := make(chan response, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/intents/k-1/approve", nil)
		if err != nil {
			answer <- response{raw: err.Error()}
			return
		}
		req.Header.Set("Authorization", "Bearer "+adminSecret)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			answer <- response{raw: err.Error()}
			return
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		answer <- response{status: res.StatusCode, raw: string(raw)}
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE application_name = 'serialization_test_api' AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the approval waits for the other transaction's lock")
	require.NoError(t, other.Commit(ctx))

	r := <-answer
	require.Equal(t, http.StatusServiceUnavailable, r.status, r.raw)
	require.Contains(t, r.raw, `"code":"unavailable"`)
	require.Contains(t, r.raw, "sending the same request again")
	again := b.do(t, http.MethodPost, "/v1/intents/k-1/approve", adminSecret, "", "")
	require.Equal(t, http.StatusOK, again.status, again.raw)
	require.Equal(t, outbox.StatusPending, again.body["status"])
}

// adminService is the intent service over pool with one token, adminSecret's, an admin
// allowed every connector.
func adminService(pool *pgxpool.Pool) *intent.Service {
	return &intent.Service{Pool: pool, Policy: &intent.Policy{Tokens: []intent.Token{
		{Name: "admin", SHA256: hash(adminSecret), Connectors: []string{"*"}, Admin: true},
	}}}
}

// poolWith returns a pool on pool's database whose sessions set params, closed when the
// test ends.
func poolWith(t *testing.T, pool *pgxpool.Pool, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// requireUnavailable requires r, the answer to what, to be the API's 503 for a database
// that is unavailable.
func requireUnavailable(t *testing.T, r response, what string) {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %s", what, r.raw)
	require.Equal(t, "unavailable", r.errCode(t))
	require.Contains(t, r.raw, "database is unavailable")
}

// databaseCalls are a request of each kind the API serves from the database (create,
// get, list, decide), as admin, for key k-1.
var databaseCalls = []struct{ method, path, body string }{
	{"POST", "/v1/intents", `{"connector":"webhook","payload":{}}`},
	{"GET", "/v1/intents/k-1", ""},
	{"GET", "/v1/intents", ""},
	{"POST", "/v1/intents/k-1/cancel", ""},
}
