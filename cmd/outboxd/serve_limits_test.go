package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
		"Run 'outboxd --help' for usage.\n", stderr.String())
	require.Empty(t, stdout.String())
}
