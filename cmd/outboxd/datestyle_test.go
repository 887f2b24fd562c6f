package main

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

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

	sep := "?"
	if strings.Contains(d.dsn, "?") {
		sep = "&"
	}
	simple := d.dsn + sep + "default_query_exec_mode=simple_protocol"
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
