package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// /readyz answers anyone who reaches OUTBOX_HTTP_ADDR, the intent API's address, with no
// token. It said why the database was unreachable in pgx's words, which name the user,
// the database and every host and address tried (and, on a refused login, the server's
// message): details the intent API keeps in the log. The answer keeps the reason and
// leaves them out.
func TestReadyzKeepsDatabaseDetailsOut(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbAddr := pgtest.UnreachableAddr(t)
	environ := []string{
		"OUTBOX_DATABASE_URL=postgres://ready_user:hunter2@" + dbAddr + "/ready_db",
		"OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook",
		"OUTBOX_HTTP_ADDR=127.0.0.1:0",
		"OUTBOX_LOG_FORMAT=json",
		"OUTBOX_LOG_LEVEL=debug",
	}
	srv := startServe(t, environ)
	addr, stderr := srv.addr, srv.stderr

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, string(body))
	require.Contains(t, string(body), "database unreachable")
	for _, detail := range []string{"ready_user", "ready_db", dbAddr, "hunter2"} {
		require.NotContains(t, string(body), detail)
	}
	// The log, which the operator reads, still has them.
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), dbAddr) }, processWait, 10*time.Millisecond, stderr)
}

// inProcessServe is `outboxd serve` run in the test's process: where it listens (it
// logs the port it got), its log, and how to stop it (a SIGTERM).
type inProcessServe struct {
	addr   string
	stderr *lockedBuffer
	stop   context.CancelFunc

	code     chan int
	once     sync.Once
	exit     int
	timedOut bool
}

// startServe runs serve with environ (which sets OUTBOX_HTTP_ADDR to a port of its own
// and OUTBOX_LOG_FORMAT=json) and waits until it listens. A cleanup stops it, and
// requires that it exit 0.
func startServe(t *testing.T, environ []string) *inProcessServe {
	t.Helper()
	serveCtx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	s := &inProcessServe{stderr: &lockedBuffer{}, stop: stop, code: make(chan int, 1)}
	go func() {
		s.code <- run(serveCtx, []string{"serve"}, environ, strings.NewReader(""), io.Discard, s.stderr)
	}()
	t.Cleanup(func() {
		s.stop()
		require.Equal(t, exitOK, s.exitCode(t), s.stderr.String())
	})
	require.Eventually(t, func() bool {
		rec, ok := findLog(s.stderr.String(), "http server listening")
		if ok {
			s.addr, _ = rec["addr"].(string)
		}
		return s.addr != ""
	}, processWait, 10*time.Millisecond, "serve never said where it listens\n%s", s.stderr)
	return s
}

// exitCode waits for serve to return, up to processWait, and returns its exit code.
func (s *inProcessServe) exitCode(t *testing.T) int {
	t.Helper()
	s.once.Do(func() {
		select {
		case s.exit = <-s.code:
		case <-time.After(processWait):
			s.timedOut = true
		}
	})
	if s.timedOut {
		t.Fatalf("serve did not stop\n%s", s.stderr)
	}
	return s.exit
}
