package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// In serve the intent API and the relay share one pool. After a failover that leaves the
// old primary up taking no writes, while new sessions reach the new primary (a URL that
// lists both, with target_session_attrs=read-write), an API write that met SQLSTATE
// 25006 first reset the pool, so the relay's claims, on new sessions, were never
// refused, and its LISTEN connection, made outside the pool, stayed on the old server:
// no NOTIFY from the new primary woke the relay, which found rows only by polling, while
// /readyz said LISTEN was up. The API's reset must move it too.
func TestServeListensOnTheNewPrimaryAfterTheAPIMetAFailover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	oldPrimary, newPrimary := pgtest.Cluster(t), pgtest.Cluster(t)
	pools := make([]*pgxpool.Pool, 2)
	for i, url := range []string{oldPrimary.URL("postgres"), newPrimary.URL("postgres")} {
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		_, err = outboxd.Migrate(ctx, pool)
		require.NoError(t, err)
		pools[i] = pool
	}
	oldPool, newPool := pools[0], pools[1]
	// listening reports whether a session LISTENs on the server of pool.
	listening := func(pool *pgxpool.Pool) bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN outbox'`).Scan(&n))
		return n > 0
	}

	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	secret, hash, err := intent.NewToken()
	require.NoError(t, err)
	environ := []string{
		fmt.Sprintf("OUTBOX_DATABASE_URL=postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			oldPrimary.Port(), newPrimary.Port()),
		"OUTBOX_WEBHOOK_URL=" + rcv.URL(),
		`OUTBOX_API_TOKENS=[{"name":"agent","sha256":"` + hash + `","connectors":["webhook"]}]`,
		// A port of its own, which it logs: one found free and closed for serve to take
		// could be taken by another test's listener in between.
		"OUTBOX_HTTP_ADDR=127.0.0.1:0",
		"OUTBOX_LOG_FORMAT=json",
		// No poll finds the row: only a NOTIFY, or a claim round the relay had anyway.
		"OUTBOX_POLL_INTERVAL=1h",
	}
	srv := startServe(t, environ)
	addr, stderr := srv.addr, srv.stderr
	get := func(path string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		require.NoError(t, err)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		_ = res.Body.Close()
		return res.StatusCode
	}
	require.Eventually(t, func() bool { return get("/readyz") == http.StatusOK }, processWait, 10*time.Millisecond, stderr.String())
	require.True(t, listening(oldPool), "the relay LISTENs on the old primary before the failover")

	// The failover. The old primary's sessions that the pool holds refuse writes: a
	// trigger stands in for that, on the API's insert alone, so that the API is sure to
	// meet it first (a claim round of the relay's would reset the pool itself). New
	// sessions there take no writes, so target_session_attrs sends them on to the new
	// primary.
	for _, stmt := range []string{
		`CREATE FUNCTION refuse_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = 'read_only_sql_transaction';
		END$$`,
		`CREATE TRIGGER refuse_write BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_write()`,
		`ALTER DATABASE postgres SET default_transaction_read_only = on`,
	} {
		_, err := oldPool.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	post := func() int {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/intents",
			strings.NewReader(`{"connector":"webhook","payload":{"n":1}}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Idempotency-Key", "after-failover")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		return res.StatusCode
	}
	// The API meets the failover on a session of the pool's on the old primary, and
	// resets the pool; the same request again reaches the new primary.
	require.Equal(t, http.StatusServiceUnavailable, post(), stderr.String())
	require.Equal(t, http.StatusCreated, post())

	require.Eventually(t, func() bool { return listening(newPool) }, 30*time.Second, 10*time.Millisecond,
		"the relay's LISTEN connection stayed on the old primary (LISTEN there: %v)", listening(oldPool))
	require.Eventually(t, func() bool {
		in, err := outbox.Get(ctx, newPool, "after-failover")
		require.NoError(t, err)
		return in.Status == outbox.StatusDelivered
	}, processWait, 10*time.Millisecond)
	require.Equal(t, 1, rcv.Effects("after-failover"))
}
