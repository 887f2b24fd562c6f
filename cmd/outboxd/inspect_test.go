package main

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	id := d.insert(t, fixture{Key: "order-42", Status: "dead", Attempts: 2, Ambiguous: true,
		LastError: "receiver answered 503", Payload: `{"order": 42, "items": ["a", "b"]}`})
	now := time.Now()
	_, err := d.pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
VALUES ($1, 1, 'relay-a', $2, $3, 'retry', true, 'timeout after 10s'),
       ($1, 2, 'relay-b', $4, $5, 'dead', false, 'receiver answered 503')`,
		id, now.Add(-time.Hour), now.Add(-time.Hour).Add(10*time.Second), now.Add(-30*time.Minute),
		now.Add(-30*time.Minute).Add(250*time.Millisecond))
	require.NoError(t, err)
	_, err = d.pool.Exec(t.Context(), `
INSERT INTO outbox_audit (outbox_id, action, actor, reason, at, details)
VALUES ($1, 'replay', 'bob', 'receiver fixed', $2, '{"from_status": "dead"}')`, id, now.Add(-10*time.Minute))
	require.NoError(t, err)

	code, out, errOut := d.cli(t, "", "inspect", "order-42")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^key:\s+order-42$`, out)
	require.Regexp(t, `(?m)^status:\s+dead$`, out)
	require.Regexp(t, `(?m)^ambiguous:\s+yes`, out)
	require.Regexp(t, `(?m)^last error:\s+receiver answered 503$`, out)
	require.Contains(t, out, "payload:\n  {\n    \"items\": [\n")
	require.Contains(t, out, "attempts (2):\n")
	require.Regexp(t, `(?m)^  1\s+\S+ \S+\s+relay-a\s+10s\s+retry\s+yes\s+timeout after 10s$`, out)
	require.Regexp(t, `(?m)^  2\s+\S+ \S+\s+relay-b\s+250ms\s+dead\s+no\s+receiver answered 503$`, out)
	require.Contains(t, out, "result:\n  -\n")
	require.Regexp(t, `(?m)^  \S+ \S+\s+replay\s+bob\s+receiver fixed\s+\{"from_status": "dead"\}$`, out)

	// --json before or after the key.
	for _, args := range [][]string{{"inspect", "order-42", "--json"}, {"inspect", "--json", "order-42"}} {
		code, out, errOut = d.cli(t, "", args...)
		require.Equal(t, exitOK, code, errOut)
		var got ops.Detail
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		require.Equal(t, "order-42", got.Intent.Key)
		require.True(t, got.Ambiguous)
		require.Len(t, got.Attempts, 2)
		require.Equal(t, "relay-b", got.Attempts[1].Relay)
		require.Len(t, got.Audit, 1)
		require.JSONEq(t, `{"order": 42, "items": ["a", "b"]}`, string(got.Intent.Payload))
	}

	code, out, errOut = d.cli(t, "", "inspect", "nope")
	require.Equal(t, exitFailure, code)
	require.Empty(t, out)
	require.Contains(t, errOut, `no intent has key "nope"`)
	require.NotContains(t, errOut, "usage")
}

// A row's Authorization, Proxy-Authorization and Cookie headers are credentials for the
// receiver. The intent API shows them to no token, admin included, as REDACTED; inspect,
// list --json, approve --json and enqueue --json (of a key already there) printed them in
// full to the terminal, and from there to tickets and chat.
func TestReadCommandsRedactCredentialHeaders(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	_, err := d.pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, headers)
VALUES ('with-creds', 'webhook', '{}', 'awaiting_approval',
        '{"Authorization": "Bearer s3cret-a", "cookie": "sid=s3cret-c", "X-Trace": "t-1"}')`)
	require.NoError(t, err)

	for _, args := range [][]string{
		{"inspect", "with-creds"},
		{"inspect", "with-creds", "--json"},
		{"list", "--json"},
		{"approve", "with-creds", "--json"},
		// The same request again: enqueue prints the row that has the key, headers and all.
		{"enqueue", "--connector", "webhook", "--key", "with-creds", "--payload", "{}", "--json"},
	} {
		code, out, errOut := d.cli(t, "", args...)
		require.Equal(t, exitOK, code, "%v: %s", args, errOut)
		require.NotContains(t, out, "s3cret", args)
		require.Contains(t, out, "REDACTED", args)
		require.Contains(t, out, "t-1", args)
	}
}

// A dead, held, delivered or canceled row has no next attempt (replay decides one), yet
// inspect printed its stale next_attempt_at as "next attempt: <time>", which reads as a
// retry scheduled; list shows "-" for them. Pending rows, and rows awaiting approval
// (whose not-before it is), keep it.
func TestInspectShowsNoNextAttemptForRowsThatWillNotBeAttempted(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	for key, want := range map[string]bool{
		"k-dead": false, "k-held": false, "k-delivered": false, "k-canceled": false, "k-delivering": false,
		"k-pending": true, "k-awaiting": true,
	} {
		code, out, errOut := d.cli(t, "", "inspect", key)
		require.Equal(t, exitOK, code, errOut)
		if want {
			require.Regexp(t, `(?m)^next attempt:\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$`, out, key)
		} else {
			require.Regexp(t, `(?m)^next attempt:\s+-$`, out, key)
		}
	}
}

// A row whose lease ran out (its relay died or lost the database) read "lease: relay-1
// until <a time already past>", as if a relay were delivering it; status counted it as
// stuck. inspect says the lease expired and what the row waits for.
func TestInspectSaysALeaseExpired(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	code, out, errOut := d.cli(t, "", "inspect", "k-stuck")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^lease:\s+relay-1, expired at \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ: stuck until a relay with connector webhook puts it back`, out)
	code, out, errOut = d.cli(t, "", "inspect", "--json", "k-stuck")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, `"lease_expired": true`)

	code, out, errOut = d.cli(t, "", "inspect", "k-delivering")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^lease:\s+relay-1 until \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$`, out)
	require.NotContains(t, out, "expired")
}

// The attempt of a row in flight is logged only when its outcome is recorded (or, once
// its lease expired, when a relay puts it back), so inspect listed every attempt but the
// current one: "attempts: 1" over "attempts (0):", and a stuck row's attempt, the one the
// receiver may have acted on, was missing from its history. It is listed last, from the
// row's lease, as in flight or as its lease expired.
func TestInspectListsTheAttemptInFlight(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)

	code, out, errOut := d.cli(t, "", "inspect", "k-delivering")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "attempts (1):\n")
	require.Regexp(t, `(?m)^  1\s+\S+ \S+\s+relay-1\s+-\s+in flight\s+no\s+-$`, out)

	code, out, errOut = d.cli(t, "", "inspect", "k-stuck")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "attempts (1):\n")
	require.Regexp(t, `(?m)^  1\s+\S+ \S+\s+relay-1\s+-\s+lease expired\s+yes\s+-$`, out)

	code, out, errOut = d.cli(t, "", "inspect", "--json", "k-stuck")
	require.Equal(t, exitOK, code, errOut)
	var got ops.Detail
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, ops.Attempt{Attempt: 1, Relay: "relay-1", StartedAt: got.Intent.UpdatedAt, Ambiguous: true}, got.Attempts[0])

	// Finished rows list their logged attempts only.
	code, out, errOut = d.cli(t, "", "inspect", "k-dead")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "attempts (0):\n")
}

// "-" marks an empty cell, so a row whose ordering key is "-" (plain SQL and the
// library take any text) read "ordering key: -", as a row without one: the operator
// was told it held nothing back. A key that is just "-" is shown quoted.
func TestInspectTellsAnOrderingKeyDashFromNone(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "with-dash", OrderingKey: "-"})
	d.insert(t, fixture{Key: "without"})

	code, out, errOut := d.cli(t, "", "inspect", "with-dash")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^ordering key:\s+"-"$`, out)
	code, out, errOut = d.cli(t, "", "inspect", "without")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^ordering key:\s+-$`, out)
}

// A copy that replay --new-key made re-executes its row's operation. inspect of the row
// names the copy (its replay audit entry's new_key), but inspect of the copy said nothing
// of the row: its key holds the row's only as a prefix, cut at 80 characters and with
// '/' and spaces turned to '_', so "order 42/notify" and "order_42_notify" look alike,
// and the operator could not tell which row's attempts may already have acted.
func TestInspectOfACopyNamesItsRow(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "order 42/notify", Status: outbox.StatusDead, Attempts: 3})
	code, _, errOut := d.cli(t, "", "replay", "--key", "order 42/notify", "--new-key")
	require.Equal(t, exitOK, code, errOut)
	copyKey := outbox.Key("order 42/notify", "replay", "1")

	code, out, errOut := d.cli(t, "", "inspect", copyKey)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^copy of:\s+"order 42/notify" \(made by replay --new-key\)$`, out)
	code, out, errOut = d.cli(t, "", "inspect", copyKey, "--json")
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		CopyOf string `json:"copy_of"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, "order 42/notify", got.CopyOf)

	// The row names its copy, as it did, and is no copy.
	code, out, errOut = d.cli(t, "", "inspect", "order 42/notify")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, copyKey)
	require.NotContains(t, out, "copy of:")
	code, out, errOut = d.cli(t, "", "inspect", "order 42/notify", "--json")
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, `"copy_of"`)
}

// The row's ambiguous flag is its latest attempt's. A row that died of a plain failure
// after an ambiguous attempt, and a stuck row (whose flag is set only when a relay puts
// it back), said "ambiguous: no" at the top of inspect, under which an operator replays
// without checking the receiver, though it may have acted: the line now says which
// attempt may have.
func TestInspectSaysAnEarlierAttemptWasAmbiguous(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	id := d.insert(t, fixture{Key: "dead-after", Status: outbox.StatusDead, Attempts: 2,
		LastError: "receiver answered 400; but attempt 1 was ambiguous: the receiver may have acted then, so check it before sending the row again"})
	now := time.Now()
	_, err := d.pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
VALUES ($1, 1, 'relay-a', $2, $2, 'retry', true, 'connection reset'),
       ($1, 2, 'relay-a', $3, $3, 'dead', false, 'receiver answered 400')`,
		id, now.Add(-time.Hour), now.Add(-time.Minute))
	require.NoError(t, err)

	code, out, errOut := d.cli(t, "", "inspect", "dead-after")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^ambiguous:\s+no, but attempt 1 was: the receiver may have acted then$`, out)

	code, out, errOut = d.cli(t, "", "inspect", "k-stuck")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^ambiguous:\s+yes: the receiver may have acted on the latest attempt$`, out)

	// No attempt that may have acted: no.
	for _, key := range []string{"k-delivering", "k-dead"} {
		code, out, errOut = d.cli(t, "", "inspect", key)
		require.Equal(t, exitOK, code, errOut)
		require.Regexp(t, `(?m)^ambiguous:\s+no$`, out)
	}
}

// A delivered row that replay --redeliver put back, and whose attempt since failed
// plainly (or has not come yet), said "ambiguous: no" at the top of inspect: no attempt of
// it was ambiguous, but the receiver did act on the delivered one, as cancel's warning
// says of the same row. The line now says so.
func TestInspectSaysAnEarlierAttemptWasDelivered(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	now := time.Now()
	for _, f := range []struct {
		key, status string
		attempts    int
	}{{"redelivered-failed", outbox.StatusPending, 2}, {"redelivered-waiting", outbox.StatusPending, 1},
		{"delivered", outbox.StatusDelivered, 1}} {
		id := d.insert(t, fixture{Key: f.key, Status: f.status, Attempts: f.attempts})
		_, err := d.pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
VALUES ($1, 1, 'relay-a', $2, $2, 'delivered', false, NULL)`, id, now.Add(-time.Hour))
		require.NoError(t, err)
		if f.attempts == 2 {
			_, err = d.pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
VALUES ($1, 2, 'relay-a', $2, $2, 'retry', false, 'receiver answered 503')`, id, now.Add(-time.Minute))
			require.NoError(t, err)
		}
	}
	for _, key := range []string{"redelivered-failed", "redelivered-waiting"} {
		code, out, errOut := d.cli(t, "", "inspect", key)
		require.Equal(t, exitOK, code, errOut)
		require.Regexp(t, `(?m)^ambiguous:\s+no, but attempt 1 was delivered: the receiver acted then, before the row was replayed$`, out, key)
	}
	code, out, errOut := d.cli(t, "", "inspect", "delivered")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^ambiguous:\s+no$`, out)
}

// replay --new-key leaves the row it re-executes as it was, held or dead, and the copy
// goes out under its own key. inspect of the row said "held" and "ambiguous: yes", the
// copy's key only in the audit details, and not whether it was delivered: read alone, an
// operation that had happened read as one still waiting for a person. It now names the
// copy and its status, as the intent API does (replayed_as), and once the copy is
// deleted, that it is gone.
func TestInspectNamesWhereTheOperationWent(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "h-op", Status: outbox.StatusHeld, Ambiguous: true, Attempts: 1, LastError: "timeout"})
	code, out, errOut := d.cli(t, "", "replay", "--key", "h-op", "--new-key", "--reason", "checked: not sent")
	require.Equal(t, exitOK, code, errOut)
	cp := outbox.Key("h-op", "replay", "1")
	require.Contains(t, out, "h-op -> "+cp)
	_, err := d.pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivered', delivered_at = now(), attempts = 1
		WHERE idempotency_key = $1`, cp)
	require.NoError(t, err)

	code, out, errOut = d.cli(t, "", "inspect", "h-op")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^replayed as:\s+`+regexp.QuoteMeta(cp)+`, delivered now \(replay --new-key re-executed the operation under that key: follow it\)$`, out)
	require.Regexp(t, `(?m)^status:\s+held$`, out)
	code, out, errOut = d.cli(t, "", "inspect", "h-op", "--json")
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		ReplayedAs map[string]any `json:"replayed_as"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, map[string]any{"key": cp, "status": "delivered"}, got.ReplayedAs)

	// The copy names the row it copies, and no copy of its own.
	code, out, errOut = d.cli(t, "", "inspect", cp)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^copy of:\s+h-op `, out)
	require.NotContains(t, out, "replayed as:")

	_, err = d.pool.Exec(t.Context(), `DELETE FROM outbox WHERE idempotency_key = $1`, cp)
	require.NoError(t, err)
	code, out, errOut = d.cli(t, "", "inspect", "h-op")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^replayed as:\s+`+regexp.QuoteMeta(cp)+`, gone: delivered or canceled, then deleted by retention or purge`, out)
}
