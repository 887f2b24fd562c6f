package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

func TestEnqueue(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)

	code, out, errOut := d.cli(t, "", "enqueue", "--connector", "webhook", "--key", "order-1",
		"--payload", `{"order": 1}`, "--ordering-key", "customer-9")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `^enqueued order-1 \(id \d+, connector webhook, status pending, next attempt .+\)\n$`, out)

	// The same request again, payload from stdin with other spacing: idempotent.
	code, out, errOut = d.cli(t, `{ "order" : 1 }`, "enqueue", "--connector", "webhook", "--key", "order-1",
		"--payload", "-", "--ordering-key", "customer-9", "--json")
	require.Equal(t, exitOK, code, errOut)
	var in struct {
		Key      string `json:"key"`
		Status   string `json:"status"`
		Inserted bool   `json:"inserted"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &in), out)
	require.Equal(t, "order-1", in.Key)
	require.False(t, in.Inserted)
	require.Equal(t, 1, d.count(t, `SELECT count(*) FROM outbox`))
	code, out, _ = d.cli(t, "", "enqueue", "--connector", "webhook", "--key", "order-1",
		"--payload", `{"order":1}`, "--ordering-key", "customer-9")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "already enqueued order-1")

	// The same key with a different payload: a conflict.
	file := filepath.Join(t.TempDir(), "p.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"order": 2}`), 0o600))
	code, _, errOut = d.cli(t, "", "enqueue", "--connector", "webhook", "--key", "order-1", "--payload", "@"+file,
		"--ordering-key", "customer-9")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "idempotency key already used for a different request")

	// From a file, scheduled.
	code, out, errOut = d.cli(t, "", "enqueue", "--connector", "webhook", "--key", "order-2", "--payload", "@"+file,
		"--not-before", "2099-01-01T00:00:00Z")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "next attempt 2099-01-01 00:00:00Z")

	// Invalid messages are bad usage, as a bad --not-before is and as list's bad
	// --connector is: exit 2 with the reason and the hint, nothing written. They exited
	// 1, as a database that cannot be reached does, so a script retried them.
	for _, args := range [][]string{
		{"--connector", "webhook", "--key", "bad-json", "--payload", `{"order":`},
		{"--connector", "carrier-pigeon", "--key", "bad-connector", "--payload", `{}`},
		{"--connector", "slack", "--key", "bad-slack", "--payload", `{"text": 1}`},
		{"--connector", "webhook", "--key", "", "--payload", `{}`},
	} {
		code, _, errOut = d.cli(t, "", append([]string{"enqueue"}, args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "outboxd: invalid message: ", args)
		require.Contains(t, errOut, "Run 'outboxd enqueue --help' for usage.", args)
	}
	// A payload file that cannot be read is bad usage (see TestEnqueuePayloadFileUnreadable).
	code, _, errOut = d.cli(t, "", "enqueue", "--connector", "webhook", "--key", "no-file",
		"--payload", "@"+filepath.Join(t.TempDir(), "missing.json"))
	require.Equal(t, exitUsage, code, errOut)
	require.Equal(t, 2, d.count(t, `SELECT count(*) FROM outbox`))
}

// Enqueueing a key again answers with the row already there, whatever its state; the line
// printed "next attempt <time>" for a delivered, dead, held, canceled or in-flight row,
// which reads as an attempt still to come, where inspect and list show "-" for them.
func TestEnqueueAgainShowsNoNextAttemptForRowsThatWillNotBeAttempted(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	for status, want := range map[string]bool{
		outbox.StatusDelivered: false, outbox.StatusDead: false, outbox.StatusHeld: false,
		outbox.StatusCanceled: false, outbox.StatusDelivering: false,
		outbox.StatusPending: true, outbox.StatusAwaitingApproval: true,
	} {
		args := []string{"enqueue", "--connector", "webhook", "--key", "k-" + status, "--payload", `{"a": 1}`}
		code, _, errOut := d.cli(t, "", args...)
		require.Equal(t, exitOK, code, errOut)
		_, err := d.pool.Exec(t.Context(), `UPDATE outbox SET status = $1, lease_owner = 'relay-1',
			lease_expires_at = now() + interval '1 hour' WHERE idempotency_key = $2`, status, "k-"+status)
		require.NoError(t, err)
		code, out, errOut := d.cli(t, "", args...)
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "already enqueued k-"+status+" ", status)
		if want {
			require.Regexp(t, `, next attempt \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\)\n$`, out, status)
		} else {
			require.Contains(t, out, ", next attempt -)\n", status)
		}
	}
}

// --ordering-key or --not-before given empty (--ordering-key "$CUSTOMER", unset) is a
// usage error, as list's and replay's empty filters are. It was taken for no flag: the
// intent was written without its ordering key, free to go out before the earlier rows
// of that key, or due at once instead of at its time.
func TestEnqueueRefusesEmptyOrderingKeyAndNotBefore(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	for _, flag := range []string{"--ordering-key", "--not-before"} {
		code, out, errOut := d.cli(t, "", "enqueue", "--connector", "webhook", "--key", "order-1",
			"--payload", `{"order": 1}`, flag, "")
		require.Equal(t, exitUsage, code, "%s: %s%s", flag, out, errOut)
		require.Contains(t, errOut, flag+" is empty", flag)
		require.Empty(t, out, flag)
	}
	require.Equal(t, 0, d.count(t, `SELECT count(*) FROM outbox`))
}

// TestEnqueuePayloadFileUnreadable: --payload @missing.json exited 1, as if the
// database had failed; a flag naming a file that cannot be read is bad usage (exit 2),
// said in one line naming the flag and the file. Nothing is enqueued.
func TestEnqueuePayloadFileUnreadable(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	dir := t.TempDir()
	for _, path := range []string{filepath.Join(dir, "missing.json"), dir} {
		code, out, errOut := d.cli(t, "", "enqueue", "--connector", "webhook", "--key", "order-1",
			"--payload", "@"+path)
		require.Equal(t, exitUsage, code, "%s: %s%s", path, out, errOut)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		require.Len(t, lines, 2, errOut) // the problem, then the pointer to --help
		require.True(t, strings.HasPrefix(lines[0], "outboxd: --payload @"+path+": "), errOut)
		require.Empty(t, out, path)
	}
	require.Equal(t, 0, d.count(t, `SELECT count(*) FROM outbox`))
}
