package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// TestServeJSONLogsHoldTheStandardLibrarysLines: net/http says some things through the
// log package's default logger, such as "Unsolicited response received on idle HTTP
// channel" for a receiver that answers a request twice. With OUTBOX_LOG_FORMAT=json
// that was a plain line among the JSON ones, which a log pipeline cannot read. Every
// line serve writes to stderr is now JSON, that one too.
func TestServeJSONLogsHoldTheStandardLibrarysLines(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					// The answer, and a second one nobody asked for.
					_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"+
						"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
				}
			}()
		}
	}()

	dsn := pgtest.URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c := startChild(t, "serve",
		"OUTBOX_DATABASE_URL="+dsn,
		"OUTBOX_WEBHOOK_URL=http://"+ln.Addr().String()+"/hook",
		"OUTBOX_HTTP_ADDR=127.0.0.1:0",
		"OUTBOX_POLL_INTERVAL=50ms",
		"OUTBOX_LOG_FORMAT=json",
	)
	_, err = outbox.Enqueue(t.Context(), pool, outbox.Message{Key: "answered-twice", Connector: "webhook", Payload: map[string]int{"n": 1}})
	require.NoError(t, err)
	c.waitOutput(t, "Unsolicited response")
	c.interrupt(t, syscall.SIGTERM)

	for line := range strings.SplitSeq(strings.TrimSpace(c.stderr.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "a line that is not JSON: %q", line)
		if strings.Contains(line, "Unsolicited response") {
			require.Equal(t, "WARN", rec["level"], "%q", line)
		}
	}
}
