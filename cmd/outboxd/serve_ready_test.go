package main

import (
	"context"
	"io"
	"net/http"
	"strings"
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
	serveCtx, stopServe := context.WithCancel(context.WithoutCancel(ctx))
	var stderr lockedBuffer
	code := make(chan int, 1)
	go func() { code <- run(serveCtx, []string{"serve"}, environ, strings.NewReader(""), io.Discard, &stderr) }()
	t.Cleanup(func() {
		stopServe()
		require.Equal(t, exitOK, <-code, stderr.String())
	})
	var addr string
	require.Eventually(t, func() bool {
		rec, ok := findLog(stderr.String(), "http server listening")
		if ok {
			addr, _ = rec["addr"].(string)
		}
		return addr != ""
	}, processWait, 10*time.Millisecond, "serve never said where it listens\n%s", &stderr)

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
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), dbAddr) }, processWait, 10*time.Millisecond, &stderr)
}
