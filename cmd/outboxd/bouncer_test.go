package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
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
	through := pgtest.Bouncer(t, d.dsn)
	sep := "?"
	if strings.Contains(through, "?") {
		sep = "&"
	}
	through += sep + "default_query_exec_mode=simple_protocol"
	d.insert(t, fixture{Key: "dead-1", Status: outbox.StatusDead, LastError: "receiver answered 400"})

	environ := []string{"OUTBOX_DATABASE_URL=" + through, "USER=alice"}
	for _, args := range [][]string{{"migrate"}, {"status"}, {"list"}, {"inspect", "dead-1"}, {"replay", "--status", "dead", "--yes"}, {"cancel", "dead-1"}} {
		code, out, errOut := runCLI(t, environ, strings.NewReader(""), args...)
		require.Equal(t, exitOK, code, "outboxd %v behind pgbouncer:\n%s%s", args, out, errOut)
	}
	in, err := outbox.Get(t.Context(), d.pool, "dead-1")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusCanceled, in.Status, "replayed, then canceled through the pooler")

	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	s := startServe(t, append(environ, "OUTBOX_WEBHOOK_URL="+rcv.URL(), "OUTBOX_HTTP_ADDR=127.0.0.1:0", "OUTBOX_LOG_FORMAT=json"))
	_, err = outbox.Enqueue(t.Context(), d.pool, outbox.Message{Key: "k-1", Connector: "webhook", Payload: json.RawMessage(`{"n":1}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		in, err := outbox.Get(t.Context(), d.pool, "k-1")
		return err == nil && in.Status == outbox.StatusDelivered
	}, processWait, 10*time.Millisecond, "serve's relay delivered nothing behind pgbouncer")
	require.Equal(t, 1, rcv.Effects("k-1"))
	// And says, once, that NOTIFY does not pass the pooler (README), after its self-test's
	// wait (5 s).
	require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "NOTIFY DOES NOT REACH THIS RELAY") },
		processWait, 10*time.Millisecond, "serve did not say that NOTIFY does not pass PgBouncer:\n%s", s.stderr)
}
