package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// Keys written by plain SQL and receivers' answers (kept in last_error) may hold control
// characters and terminal escape sequences. The text output of the operator commands must
// not pass them to the operator's terminal, where they would clear the screen, retitle
// the window or draw a fake table row, and must show a key so that it can be told from
// another and typed back.
func TestTextOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	const (
		evilKey   = "evil\x1b[2J\x1b]0;owned\x07key"
		spacedKey = "order  42" // two spaces: not "order 42"
		tabKey    = "order\t42"
	)
	d.insert(t, fixture{Key: evilKey, Status: outbox.StatusDead, Payload: `{}`,
		LastError: "POST http://127.0.0.1/hook: receiver answered 400 Bad Request: \x1b[31mok\x1b[0m"})
	d.insert(t, fixture{Key: spacedKey, Status: outbox.StatusPending})
	d.insert(t, fixture{Key: "order 42", Status: outbox.StatusPending})
	d.insert(t, fixture{Key: tabKey, Status: outbox.StatusPending, Payload: `{}`})

	code, out, errOut := d.cli(t, "", "list")
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "\x1b", "list passes an escape sequence to the terminal:\n%q", out)
	require.NotContains(t, out, "\x07")
	require.Contains(t, out, `"evil\x1b[2J\x1b]0;owned\akey"`)
	require.Contains(t, out, `"order  42"`)
	require.Contains(t, out, `"order 42"`)
	require.Contains(t, out, `"order\t42"`)

	code, out, errOut = d.cli(t, "", "inspect", evilKey)
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "\x1b", "inspect passes an escape sequence to the terminal:\n%q", out)
	require.Regexp(t, `(?m)^key:\s+"evil\\x1b\[2J\\x1b\]0;owned\\akey"$`, out)

	code, out, errOut = d.cli(t, "", "cancel", evilKey, spacedKey)
	require.Equal(t, exitFailure, code, errOut) // the dead row is refused
	require.NotContains(t, out, "\x1b", "cancel passes an escape sequence to the terminal:\n%q", out)
	require.Contains(t, out, "canceled: 1\n  \"order  42\"\n")

	code, out, errOut = d.cli(t, "", "replay", "--key", evilKey, "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "\x1b", "replay passes an escape sequence to the terminal:\n%q", out)

	// A plain key is shown as it is.
	d.insert(t, fixture{Key: "order-43/notify-crm", Status: outbox.StatusPending})
	code, out, errOut = d.cli(t, "", "list", "--key-prefix", "order-43")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^order-43/notify-crm\s`, out)
	require.False(t, strings.Contains(out, `"order-43`))
}

// A receiver's answer is stored as it came (its result), and jsonb escapes only the
// control characters below U+0020: C1 controls such as U+009B (CSI, which some terminals
// take as the start of an escape sequence), DEL and format characters such as U+202E
// (right-to-left override, which makes the text after it read backwards) came through
// inspect's payload and result as they were.
func TestInspectEscapesPayloadAndResult(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	_, err := d.pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, result, delivered_at)
VALUES ('k', 'webhook', '{"note": "a\u202eb"}', 'delivered', '{"body": "\u009b2J\u007f\u001b"}', now())`)
	require.NoError(t, err)
	code, out, errOut := d.cli(t, "", "inspect", "k")
	require.Equal(t, exitOK, code, errOut)
	for _, r := range []string{"\u202e", "\u009b", "\u007f", "\x1b"} {
		require.NotContains(t, out, r, "%q", out)
	}
	require.Contains(t, out, `"note": "a\u202eb"`)
	require.Contains(t, out, `"body": "\u009b2J\u007f\u001b"`)

	// --json too, and it still means the same text.
	code, out, errOut = d.cli(t, "", "inspect", "k", "--json")
	require.Equal(t, exitOK, code, errOut)
	for _, r := range []string{"\u202e", "\u009b", "\u007f", "\x1b"} {
		require.NotContains(t, out, r, "%q", out)
	}
	var got ops.Detail
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.JSONEq(t, `{"note": "a\u202eb"}`, string(got.Intent.Payload))
	require.JSONEq(t, `{"body": "\u009b2J\u007f\u001b"}`, string(got.Intent.Result))
}

// Every text the operator commands print from the database, whoever wrote it (an
// application, plain SQL, an agent through the intent API, a relay from a receiver's
// answer), reaches the terminal with its control characters shown as escapes: the
// commands' own line breaks are the only ones. Each column an operator command prints
// holds here ESC, a carriage return, BEL, a C1 CSI, DEL and a right-to-left override
// (JSON columns as \u escapes, which jsonb keeps only below U+0020).
func TestOperatorCommandsEscapeEveryStoredText(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	const (
		raw  = "\x1b[2K\r\x07\u009b1A\u007f\u202e"
		json = `"\u001b[2K\r\u0007\u009b1A\u007f\u202e"`
	)
	for _, key := range []string{"n-dead", "n-held", "n-awaiting", "n-awaiting-2", "n-stuck"} {
		status := map[string]string{"n-dead": outbox.StatusDead, "n-held": outbox.StatusHeld,
			"n-awaiting": outbox.StatusAwaitingApproval, "n-awaiting-2": outbox.StatusAwaitingApproval,
			"n-stuck": outbox.StatusDelivering}[key]
		id := d.insert(t, fixture{Key: key, Status: status, LeaseIn: -time.Minute, Ambiguous: status == outbox.StatusHeld,
			Attempts: 1, LastError: "receiver answered " + raw, OrderingKey: "ok-" + key + raw,
			Payload: `{"note": ` + json + `}`})
		_, err := d.pool.Exec(t.Context(), `
UPDATE outbox SET created_by = $2, headers = jsonb_build_object('x-note', $2::text), result = $3::jsonb,
       lease_owner = CASE WHEN status = 'delivering' THEN $2 END
WHERE id = $1`, id, "agent"+raw, `{"body": `+json+`}`)
		require.NoError(t, err)
		_, err = d.pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
VALUES ($1, 1, $2, now() - interval '1 minute', now(), 'retry', true, $2)`, id, "relay"+raw)
		require.NoError(t, err)
		_, err = d.pool.Exec(t.Context(), `
INSERT INTO outbox_audit (outbox_id, action, actor, reason, details)
VALUES ($1, 'replay', $2, $2, $3::jsonb)`, id, "bob"+raw, `{"from_status": "dead", "note": `+json+`}`)
		require.NoError(t, err)
	}
	for _, args := range [][]string{
		{"list"}, {"list", "--json"}, {"list", "--status", "dead", "--error-contains", "receiver"},
		{"inspect", "n-dead"}, {"inspect", "n-stuck"}, {"inspect", "n-held", "--json"},
		{"status"}, {"status", "--json"},
		{"replay", "--key", "n-dead", "--key", "n-stuck", "--key", "n-awaiting", "--dry-run"},
		{"replay", "--status", "dead,held", "--dry-run"}, {"replay", "--status", "dead,held", "--dry-run", "--json"},
		{"approve", "n-awaiting"}, {"reject", "n-awaiting-2", "--json"},
		{"cancel", "n-held", "n-stuck"}, {"cancel", "n-held", "--json"},
		{"replay", "--key", "n-dead", "--reason", "fixed"},
		{"inspect", "n-dead"}, {"inspect", "n-held"},
	} {
		_, out, errOut := d.cli(t, "", args...)
		for _, text := range []string{out, errOut} {
			if i := strings.IndexFunc(text, func(r rune) bool { return notGraphic(r) && r != '\n' }); i >= 0 {
				line := text[strings.LastIndex(text[:i], "\n")+1:]
				if j := strings.IndexByte(line, '\n'); j >= 0 {
					line = line[:j]
				}
				t.Errorf("%v passes a control character to the terminal: %q", args, line)
			}
		}
	}
}
