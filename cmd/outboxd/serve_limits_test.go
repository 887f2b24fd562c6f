package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// TestServeRefusesConcurrencyItCannotHold runs `outboxd serve` as a process with an
// OUTBOX_CONCURRENCY that Load took but the relay cannot hold: relay.New sizes its
// queues for twenty rounds of deliveries per worker (about 8 kB each), and 2,000,000,000
// workers made the process die with "fatal error: runtime: out of memory" and a stack
// trace, not one line that names the variable. A process, because that error cannot be
// recovered from.
func TestServeRefusesConcurrencyItCannotHold(t *testing.T) {
	t.Parallel()

	environ := make([]string, 0, len(os.Environ())+4)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			environ = append(environ, kv)
		}
	}
	environ = append(environ,
		serveChildEnv+"=1",
		// Never reached: the configuration is refused first.
		"OUTBOX_DATABASE_URL=postgres://app:hunter2@127.0.0.1:1/app?connect_timeout=1",
		"OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook",
		"OUTBOX_HTTP_ADDR=127.0.0.1:0",
		"OUTBOX_CONCURRENCY=2000000000",
	)
	var stdout, stderr bytes.Buffer
	child := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	child.Env = environ
	child.Stdout, child.Stderr = &stdout, &stderr
	err := child.Run()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "serve did not exit with an error: %v\n%s", err, stderr.String())
	require.Equal(t, exitUsage, exit.ExitCode(), stderr.String())
	require.Equal(t, "outboxd: invalid configuration:\n"+
		"- OUTBOX_CONCURRENCY must be at most 10000, got 2000000000\n"+
		"Run 'outboxd serve --help' for usage.\n", stderr.String())
	require.Empty(t, stdout.String())
}

// TestServeRefusesUnmigratedDatabaseInOneLine: serve on a database without the schema
// stops with one line that says what to do, and leaves nothing behind: no row written,
// its port free again. The line used to say "relay: relay: ...", the relay's own prefix
// twice.
func TestServeRefusesUnmigratedDatabaseInOneLine(t *testing.T) {
	t.Parallel()

	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `DROP TABLE outbox_schema_migrations`)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"serve"}, []string{
		"OUTBOX_DATABASE_URL=" + pool.Config().ConnString(),
		"OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook",
		"OUTBOX_HTTP_ADDR=" + addr,
		"OUTBOX_LOG_LEVEL=warn",
	}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitFailure, code, stderr.String())
	require.Equal(t, "outboxd: relay: the database's outbox schema is at version 0 and this relay needs version "+
		strconv.Itoa(outboxd.SchemaVersion)+": run outboxd migrate (or outboxd.Migrate) first\n", stderr.String())

	var wrote int
	require.NoError(t, pool.QueryRow(t.Context(),
		`SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outbox_wake_connectors)`).Scan(&wrote))
	require.Zero(t, wrote, "serve wrote rows")
	again, err := net.Listen("tcp", addr)
	require.NoError(t, err, "serve left its listener open")
	require.NoError(t, again.Close())
}
