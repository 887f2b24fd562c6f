package main

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// With OUTBOX_LOG_FORMAT=json every line serve writes to stderr is a JSON object, the
// error it stops with included: it used to be printed as a plain "outboxd: ..." line,
// which a JSON log pipeline cannot parse (and files without its level), the one line
// that says why the relay exited.
func TestServeFailureIsJSONWithJSONLogs(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	environ := []string{
		"OUTBOX_DATABASE_URL=postgres://app:hunter2@127.0.0.1:1/app?connect_timeout=1",
		"OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook",
		"OUTBOX_HTTP_ADDR=" + taken.Addr().String(),
		"OUTBOX_LOG_FORMAT=json",
	}
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"serve"}, environ, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitFailure, code, stderr.String())
	require.Contains(t, stderr.String(), "OUTBOX_HTTP_ADDR", "the error is reported")
	require.NotContains(t, stderr.String(), "hunter2")
	var sawError bool
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "not a JSON line: %q", line)
		sawError = sawError || rec["level"] == "ERROR"
	}
	require.True(t, sawError, "the failure is logged at level ERROR:\n%s", stderr.String())
}
