package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// The README's advice behind a transaction-mode pooler (default_query_exec_mode=
// simple_protocol in OUTBOX_DATABASE_URL), against a real PgBouncer with its defaults:
// migrate, the operator commands and serve work through it, and serve delivers. Every
// session of outboxd's used to ask for default_transaction_isolation as a startup
// parameter, which PgBouncer does not track and refuses ("unsupported startup parameter:
// default_transaction_isolation"): every command failed to connect, whatever the URL
// said. It is asked for now only where the sessions' default is another isolation.
func TestCommandsWorkBehindPgBouncer(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	through := withParam(pgtest.Bouncer(t, d.dsn), "default_query_exec_mode=simple_protocol")
	d.insert(t, fixture{Key: "dead-1", Status: outbox.StatusDead, LastError: "receiver answered 400"})

	environ := []string{"OUTBOX_DATABASE_URL=" + through, "USER=alice"}
	for _, args := range [][]string{{"migrate"}, {"status"}, {"list"}, {"inspect", "dead-1"}, {"replay", "--status", "dead", "--yes"}, {"cancel", "dead-1"}} {
		code, out, errOut := runCLI(t, environ, strings.NewReader(""), args...)
		require.Equal(t, exitOK, code, "outboxd %v behind pgbouncer:\n%s%s", args, out, errOut)
	}
	in, err := outbox.Get(t.Context(), d.pool, "dead-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusCanceled, in.Status, "replayed, then canceled through the pooler")

	s := serveDelivers(t, d.pool, environ)
	// And says, once, that NOTIFY does not pass the pooler (README), after its self-test's
	// wait (5 s).
	require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "NOTIFY DOES NOT REACH THIS RELAY") },
		processWait, 10*time.Millisecond, "serve did not say that NOTIFY does not pass PgBouncer:\n%s", s.stderr)
}
