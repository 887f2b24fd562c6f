package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/config"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// In the simple protocol (the README's advice behind a transaction pooler) pgx reads
// every result as text, and a timestamp's text only in the ISO DateStyle: on a database
// set to another, list and inspect failed on every row ("invalid PostgreSQL date/time
// value"), and serve's relay refused to start. The commands now ask for the ISO style
// in their own sessions, unless the URL names one.
func TestCommandsReadTimesOnADatabaseOfAnotherDateStyle(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	var db string
	require.NoError(t, d.pool.QueryRow(t.Context(), `SELECT current_database()`).Scan(&db))
	_, err := d.pool.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET datestyle = 'SQL, DMY'`)
	require.NoError(t, err)
	d.insert(t, fixture{Key: "k-1", Status: outbox.StatusDead, LastError: "receiver answered 400"})

	simple := withParam(d.dsn, "default_query_exec_mode=simple_protocol")
	environ := []string{"OUTBOX_DATABASE_URL=" + simple, "USER=alice"}
	for _, args := range [][]string{{"list"}, {"inspect", "k-1", "--json"}, {"status"}} {
		code, out, errOut := runCLI(t, environ, strings.NewReader(""), args...)
		require.Equal(t, exitOK, code, "%v: %s", args, errOut)
		require.NotEmpty(t, out, args)
	}

	cfg, err := poolConfig(simple, 128)
	require.NoError(t, err)
	require.Equal(t, "ISO", cfg.ConnConfig.RuntimeParams["datestyle"], "serve's sessions ask for the ISO style")
	cfg, err = poolConfig(simple+"&DateStyle=German", 128)
	require.NoError(t, err)
	require.Equal(t, "German", cfg.ConnConfig.RuntimeParams["DateStyle"], "the URL's own is kept")
	require.NotContains(t, cfg.ConnConfig.RuntimeParams, "datestyle")
}

// serve's relay refuses sessions whose DateStyle (in the text modes) or default
// isolation it cannot work with, naming the setting; serve's own sessions ask for what it
// needs, so on a database set up otherwise (DateStyle SQL, REPEATABLE READ by default)
// serve starts and delivers, in the simple protocol too.
func TestServeDeliversOnADatabaseOfOtherSessionDefaults(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	var db string
	require.NoError(t, d.pool.QueryRow(t.Context(), `SELECT current_database()`).Scan(&db))
	for _, set := range []string{`datestyle = 'SQL, DMY'`, `default_transaction_isolation = 'repeatable read'`} {
		_, err := d.pool.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET `+set)
		require.NoError(t, err)
	}
	serveDelivers(t, d.pool, []string{"OUTBOX_DATABASE_URL=" + withParam(d.dsn, "default_query_exec_mode=simple_protocol")})
}

// withParam is dsn, a URL, with the parameter param (name=value) added.
func withParam(dsn, param string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&" + param
	}
	return dsn + "?" + param
}

// serveDelivers starts serve with environ and a webhook receiver of its own, enqueues a
// row in pool and waits until serve's relay has delivered it, with one effect; it
// returns the running serve.
func serveDelivers(t *testing.T, pool *pgxpool.Pool, environ []string) *inProcessServe {
	t.Helper()
	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	s := startServe(t, append(environ, "OUTBOX_WEBHOOK_URL="+rcv.URL(), "OUTBOX_HTTP_ADDR=127.0.0.1:0", "OUTBOX_LOG_FORMAT=json"))
	_, err = outbox.Enqueue(t.Context(), pool, outbox.Message{Key: "k-1", Connector: "webhook", Payload: json.RawMessage(`{"n":1}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		in, err := outbox.Get(t.Context(), pool, "k-1")
		return err == nil && in.Status == outbox.StatusDelivered
	}, processWait, 10*time.Millisecond, "serve's relay delivered nothing")
	require.Equal(t, 1, rcv.Effects("k-1"))
	return s
}

// outboxd's sessions ask for read committed as a startup parameter only where the
// sessions' default is another isolation (config.SessionDefaults): a transaction pooler
// such as PgBouncer refuses a startup parameter it does not track, this one among them
// (TestCommandsWorkBehindPgBouncer), so on a database that runs read committed by
// default, as most do, none is sent; on one that runs repeatable read, it is, in the
// pool's sessions and migrate's; and a URL that names one keeps its own.
func TestSessionsAskForReadCommittedOnlyWhereTheDefaultIsAnother(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	source := func(t *testing.T, dsn string) (level, from string) {
		t.Helper()
		cfg, err := config.ParseDSN("OUTBOX_DATABASE_URL", dsn)
		require.NoError(t, err)
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		defer pool.Close()
		require.NoError(t, pool.QueryRow(t.Context(),
			`SELECT setting, source FROM pg_settings WHERE name = 'default_transaction_isolation'`).Scan(&level, &from))
		return level, from
	}
	level, from := source(t, d.dsn)
	require.Equal(t, "read committed", level)
	require.Equal(t, "default", from, "no startup parameter where read committed is the default")

	var db string
	require.NoError(t, d.pool.QueryRow(t.Context(), `SELECT current_database()`).Scan(&db))
	_, err := d.pool.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_isolation = 'repeatable read'`)
	require.NoError(t, err)
	level, from = source(t, d.dsn)
	require.Equal(t, "read committed", level)
	require.Equal(t, "client", from, "asked for where the database's default is repeatable read")
	code, _, errOut := runCLI(t, d.environ, strings.NewReader(""), "migrate")
	require.Equal(t, exitOK, code, errOut)

	named := withParam(d.dsn, "default_transaction_isolation=serializable")
	level, _ = source(t, named)
	require.Equal(t, "serializable", level, "the URL's own is kept")
	code, _, errOut = runCLI(t, []string{"OUTBOX_DATABASE_URL=" + named}, strings.NewReader(""), "migrate")
	require.Equal(t, exitOK, code, errOut)
}
