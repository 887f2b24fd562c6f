package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

func TestReplayByKey(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook", "OUTBOX_WEBHOOK_GUARANTEE=enforced")
	d.seedEveryState(t)

	// --dry-run changes nothing.
	code, out, errOut := d.cli(t, "", "replay", "--key", "k-dead", "--key", "k-held", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "dry run: nothing was changed\nwould replay: 2\n  k-dead\n  k-held\n")
	require.Equal(t, outbox.StatusDead, d.status(t, "k-dead"))
	require.Equal(t, outbox.StatusHeld, d.status(t, "k-held"))
	require.Zero(t, d.count(t, `SELECT count(*) FROM outbox_audit`))

	code, out, errOut = d.cli(t, "", "replay", "--key", "k-dead", "--key", "k-pending", "--reason", "fixed", "--json")
	require.Equal(t, exitOK, code, errOut)
	var res ops.ReplayResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, []string{"k-dead"}, res.Replayed)
	require.Equal(t, []string{"k-pending"}, res.Unchanged)
	require.False(t, res.DryRun)
	require.Equal(t, outbox.StatusPending, d.status(t, "k-dead"))
	require.Equal(t, 1, d.count(t, `SELECT count(*) FROM outbox_audit WHERE actor = 'alice' AND reason = 'fixed'`))

	// Delivered rows are refused without --redeliver: exit 1, the others still done.
	code, out, errOut = d.cli(t, "", "replay", "--key", "k-delivered", "--key", "k-held", "--key", "missing")
	require.Equal(t, exitFailure, code)
	require.Contains(t, out, "replayed: 1\n  k-held\n")
	require.Contains(t, out, "refused: 1\n  k-delivered: already delivered")
	require.Contains(t, out, "not found: 1\n  missing: no intent has this key\n")
	require.Contains(t, errOut, "2 of the keys given were not replayed (1 not found, 1 refused)")
	require.Equal(t, outbox.StatusDelivered, d.status(t, "k-delivered"))
	require.Equal(t, outbox.StatusPending, d.status(t, "k-held"))

	// With --redeliver it is replayed, and the guarantee is explained.
	code, out, errOut = d.cli(t, "", "replay", "--key", "k-delivered", "--redeliver")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "replayed: 1\n  k-delivered\n")
	require.Contains(t, out, "redelivering sends delivered rows again:\n  webhook: "+ops.GuaranteeNote(connectors.Enforced))
	require.Equal(t, outbox.StatusPending, d.status(t, "k-delivered"))
}

func TestReplayByFilterAsksFirst(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	for i := range 12 {
		d.insert(t, fixture{Key: fmt.Sprintf("dead-%02d", i), Status: outbox.StatusDead, LastError: "boom"})
	}
	d.insert(t, fixture{Key: "other-dead", Connector: "slack", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "canceled", Status: outbox.StatusCanceled, LastError: "boom"})

	// Filters that match nothing: one line, exit 1, nothing changes.
	code, _, errOut := d.cli(t, "", "replay", "--status", "dead", "--connector", "nope", "--yes")
	require.Equal(t, exitFailure, code)
	require.Equal(t, "outboxd: no intents match the filters; nothing was changed\n", errOut)

	// More than 10 rows, no terminal: refused, nothing changed.
	code, out, errOut := d.cli(t, "y\n", "replay", "--connector", "webhook", "--status", "dead")
	require.Equal(t, exitFailure, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "replay would change 12 rows")
	require.Contains(t, errOut, "pass --yes")
	require.Equal(t, 12, d.count(t, `SELECT count(*) FROM outbox WHERE status = 'dead' AND connector = 'webhook'`))

	// A dry run shows them, and changes nothing either.
	code, out, errOut = d.cli(t, "", "replay", "--connector", "webhook", "--status", "dead", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would replay: 12\n")
	require.Equal(t, 12, d.count(t, `SELECT count(*) FROM outbox WHERE status = 'dead' AND connector = 'webhook'`))

	// A filter's refusals are reported, and do not fail the command.
	code, out, errOut = d.cli(t, "", "replay", "--error-contains", "boom", "--yes", "--batch-size", "5")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "replayed: 12\n")
	require.Contains(t, out, "refused: 1\n  canceled: canceled rows stay canceled")
	require.Zero(t, d.count(t, `SELECT count(*) FROM outbox WHERE status = 'dead' AND connector = 'webhook'`))
	require.Equal(t, outbox.StatusDead, d.status(t, "other-dead"))
}

// TestReplayThenRelayDeliversOnce replays dead rows, lets a relay deliver them to a
// receiver that enforces keys, then redelivers them: each key has one effect.
func TestReplayThenRelayDeliversOnce(t *testing.T) {
	t.Parallel()
	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL="+rcv.URL(), "OUTBOX_WEBHOOK_GUARANTEE=enforced")
	keys := []string{"dead-a", "dead-b", "dead-c"}
	for _, k := range keys {
		d.insert(t, fixture{Key: k, Status: outbox.StatusDead, Attempts: 25, LastError: "receiver was down"})
	}
	d.insert(t, fixture{Key: "canceled", Status: outbox.StatusCanceled})

	code, out, errOut := d.cli(t, "", "replay", "--status", "dead", "--reason", "receiver is back")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "replayed: 3\n")

	deliverAll := func() {
		t.Helper()
		hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced, Timeout: 5 * time.Second})
		require.NoError(t, err)
		r, err := relay.New(d.pool, &relay.Config{PollInterval: 20 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
			map[string]relay.Instance{"webhook": {Connector: hook}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		require.Eventually(t, func() bool {
			return d.count(t, `SELECT count(*) FROM outbox WHERE idempotency_key = ANY($1) AND status = 'delivered'`, keys) == len(keys)
		}, time.Minute, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
	}
	deliverAll()
	for _, k := range keys {
		require.Equal(t, 1, rcv.Effects(k), k)
	}
	require.Equal(t, outbox.StatusCanceled, d.status(t, "canceled"))

	// Redelivering sends them again; the receiver answers from its record.
	code, out, errOut = d.cli(t, "", "replay", "--status", "delivered", "--redeliver", "--yes")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "replayed: 3\n")
	require.Contains(t, out, "webhook: enforced:")
	deliverAll()
	for _, k := range keys {
		require.Equal(t, 1, rcv.Effects(k), k)
		require.Equal(t, 2, rcv.Requests(k), k)
	}
	require.Empty(t, rcv.DuplicateKeys())
	require.Equal(t, 3, strings.Count(out, "\n  dead-"))
}

// A filter flag given an empty value (a shell variable that was not set: --connector
// "$CONNECTOR") must be refused, not taken as no filter: replay --connector "" --status
// dead replayed the dead rows of every connector, and replay --status "" selected rows in
// every status.
func TestReplayRefusesEmptyFilterValues(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	for _, args := range [][]string{
		{"replay", "--connector", "", "--status", "dead", "--yes"},
		{"replay", "--status", "", "--yes"},
		{"replay", "--status", ",", "--yes"},
		{"replay", "--key-prefix", "", "--yes"},
		{"replay", "--error-contains", "", "--status", "dead", "--yes"},
		{"replay", "--ordering-key", "", "--yes"},
		{"list", "--status", ""},
		{"list", "--connector", ""},
	} {
		code, _, errOut := d.cli(t, "", args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "is empty", args)
	}
	require.Equal(t, outbox.StatusDead, d.status(t, "k-dead"))
	require.Equal(t, outbox.StatusDead, d.status(t, "s-dead"))
	require.Equal(t, outbox.StatusHeld, d.status(t, "k-held"))
	require.Zero(t, d.count(t, `SELECT count(*) FROM outbox_audit`))
}

// --rate takes any float, NaN and Inf included. NaN passed the "negative" check and then
// capped nothing (NaN > 0 is false): replay --rate NaN ran at full speed, the opposite of
// what an operator pacing the replay asked for.
func TestReplayRefusesRateThatIsNotANumber(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	for _, rate := range []string{"NaN", "Inf", "+Inf"} {
		code, _, errOut := d.cli(t, "", "replay", "--status", "dead", "--rate", rate, "--yes")
		require.Equal(t, exitUsage, code, "%s: %s", rate, errOut)
		require.Contains(t, errOut, "--rate", rate)
	}
	require.Equal(t, outbox.StatusDead, d.status(t, "k-dead"))
	require.Zero(t, d.count(t, `SELECT count(*) FROM outbox_audit`))

	_, err := ops.Replay(t.Context(), d.pool, ops.Selection{Keys: []string{"k-dead"}},
		ops.ReplayOptions{Actor: "alice", Rate: math.NaN()})
	require.ErrorIs(t, err, ops.ErrInvalidOptions)
	require.Equal(t, outbox.StatusDead, d.status(t, "k-dead"))
}

// With --json, stdout is JSON whenever the command got as far as selecting rows, as for
// list, whose empty selection prints {"intents": [], ...} and exits 1. A replay whose
// filters matched nothing printed nothing at all, so a script reading its JSON (jq
// .replayed) failed on empty input instead of reading an empty result.
func TestReplayJSONWithNoMatchIsJSON(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	for _, dry := range []bool{true, false} {
		args := []string{"replay", "--status", "dead", "--connector", "nope", "--yes", "--json"}
		if dry {
			args = append(args, "--dry-run")
		}
		code, out, errOut := d.cli(t, "", args...)
		require.Equal(t, exitFailure, code)
		require.Equal(t, "outboxd: no intents match the filters; nothing was changed\n", errOut)
		var res ops.ReplayResult
		require.NoError(t, json.Unmarshal([]byte(out), &res), "stdout: %q", out)
		require.Empty(t, res.Replayed)
		require.Equal(t, dry, res.DryRun)
	}
}

// replay --redeliver --new-key re-executes a delivered row under a new key, which no
// receiver has seen: it acts again whatever its guarantee. The note said what the
// guarantee means for the same key ("enforced: ... acts only once"), telling the
// operator that a second effect would not happen when it would.
func TestRedeliverWithNewKeySaysTheReceiverActsAgain(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook", "OUTBOX_WEBHOOK_GUARANTEE=enforced")
	d.insert(t, fixture{Key: "paid", Status: outbox.StatusDelivered, Attempts: 1})

	requireActsAgainNote(t, d, "--key", "paid", "--redeliver", "--new-key", "--reason", "charge again")
	require.Equal(t, 2, d.count(t, `SELECT count(*) FROM outbox`))
}

// A second replay --new-key of a row whose copy is still on its way leaves it unchanged.
// The output said "(already pending)" of the row, which is dead, and did not name the
// copy the operator should look at.
func TestReplayNewKeyUnchangedNamesTheCopy(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "gone", Status: outbox.StatusDead, Attempts: 3})
	code, out, errOut := d.cli(t, "", "replay", "--key", "gone", "--new-key")
	require.Equal(t, exitOK, code, errOut)
	copyKey := outbox.Key("gone", "replay", "1")
	require.Contains(t, out, "replayed: 1\n  gone -> "+copyKey+"\n")

	code, out, errOut = d.cli(t, "", "replay", "--key", "gone", "--new-key")
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "already pending")
	require.Contains(t, out, "unchanged: 1\n  gone (its copy "+copyKey+" is still on its way)\n")
	require.Equal(t, outbox.StatusDead, d.status(t, "gone"))
}

// replay --redeliver --limit N explains the guarantee of the connectors whose delivered
// rows are among the N selected. It read every delivered row the filters match, past the
// limit (all of them, however many retention keeps, before replaying any), and explained
// connectors none of whose rows would be sent.
func TestRedeliverNotesKeepToTheLimit(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook", "OUTBOX_WEBHOOK_GUARANTEE=enforced")
	d.insert(t, fixture{Key: "old-slack", Connector: "slack", Status: outbox.StatusDelivered, Age: 2 * time.Hour})
	d.insert(t, fixture{Key: "new-hook", Status: outbox.StatusDelivered, Age: time.Hour})

	code, out, errOut := d.cli(t, "", "replay", "--status", "delivered", "--redeliver", "--limit", "1", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would replay: 1\n  new-hook\n")
	require.Contains(t, out, "webhook: "+ops.GuaranteeNote(connectors.Enforced))
	require.NotContains(t, out, "slack")

	// Without a limit, every delivered row the filters match is selected, and explained.
	code, out, errOut = d.cli(t, "", "replay", "--status", "delivered,dead", "--redeliver", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "slack: guarantee unknown here")
}

// replay --json and cancel --json answer with the same fields whatever happened, so a
// script can read .not_found[] of either. replay left not_found out when every key had a
// row (cancel always has it), and jq's .not_found[] then failed on null.
func TestReplayJSONHasEveryFieldAlways(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	for _, args := range [][]string{
		{"replay", "--key", "k-dead", "--json", "--dry-run"},
		{"replay", "--status", "dead", "--json", "--dry-run"},
		{"cancel", "k-pending", "--json"},
	} {
		code, out, errOut := d.cli(t, "", args...)
		require.Equal(t, exitOK, code, "%v: %s", args, errOut)
		var fields map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(out), &fields), out)
		require.Contains(t, fields, "not_found", "%v: %s", args, out)
		require.JSONEq(t, `[]`, string(fields["not_found"]), args)
	}
}

// replay --new-key --json names the copies in new_keys, an object, also when no row
// was copied: a script reading .new_keys | to_entries failed on null when every row was
// refused or unchanged.
func TestReplayNewKeyJSONHasNewKeysAlways(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "paid", Status: outbox.StatusDelivered, Attempts: 1})
	for _, args := range [][]string{
		{"replay", "--key", "paid", "--new-key", "--json", "--dry-run"},
		{"replay", "--status", "delivered", "--new-key", "--json"},
	} {
		_, out, errOut := d.cli(t, "", args...)
		var fields map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(out), &fields), "%v: %s %s", args, out, errOut)
		require.Contains(t, fields, "new_keys", "%v: %s", args, out)
		require.JSONEq(t, `{}`, string(fields["new_keys"]), args)
	}
	_, out, _ := d.cli(t, "", "replay", "--key", "paid", "--json", "--dry-run")
	require.NotContains(t, out, "new_keys", "without --new-key there are no copies to name")
}

// A row with an ambiguous attempt (held for an operator, dead after a timeout, stuck in
// delivering) may have reached the receiver: replaying it sends it again, and
// a receiver that does not enforce the key may act twice. replay said what the
// guarantee means only for delivered rows (--redeliver), and replayed such rows of a
// forwarded webhook without a word.
func TestReplayOfAmbiguousRowsSaysWhatTheGuaranteeMeans(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook") // forwarded, the default
	d.insert(t, fixture{Key: "held", Status: outbox.StatusHeld, Ambiguous: true, Attempts: 1, LastError: "timeout"})
	d.insert(t, fixture{Key: "stuck", Status: outbox.StatusDelivering, LeaseIn: -time.Minute, Attempts: 1})
	d.insert(t, fixture{Key: "plain", Connector: "slack", Status: outbox.StatusDead, Attempts: 3, LastError: "422"})
	// Dead after a plain failure that followed a timeout: the latest attempt cleared the
	// row's mark, and the one before may have acted.
	earlier := d.insert(t, fixture{Key: "earlier", Connector: "email", Status: outbox.StatusDead, Attempts: 2,
		LastError: "attempt 2: 550 mailbox unavailable"})
	_, err := d.pool.Exec(t.Context(), `
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
VALUES ($1, 1, 'relay-1', now() - interval '2 minutes', now() - interval '1 minute', 'retry', true, 'timeout after DATA'),
       ($1, 2, 'relay-1', now() - interval '30 seconds', now() - interval '29 seconds', 'dead', false, '550')`, earlier)
	require.NoError(t, err)
	note := "webhook: " + ops.GuaranteeNote(connectors.Forwarded)

	code, out, errOut := d.cli(t, "", "replay", "--key", "held", "--key", "stuck", "--key", "plain", "--key", "earlier",
		"--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would replay: 4\n")
	require.Contains(t, out, note, "dry run")
	require.Contains(t, out, "email: guarantee unknown here", "dry run")
	require.NotContains(t, out, "slack:", "a plain failure reached no receiver's effect")

	code, out, errOut = d.cli(t, "", "replay", "--status", "held,delivering", "--json")
	require.Equal(t, exitOK, code, errOut)
	var res struct {
		Ambiguous map[string]string `json:"ambiguous"`
		Notes     []string          `json:"ambiguous_notes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, map[string]string{"held": "webhook", "stuck": "webhook"}, res.Ambiguous)
	require.Equal(t, []string{note}, res.Notes)
}

// A row whose copy (replay --new-key) may have acted, then was canceled, is in the
// result's ambiguous rows, and replaying the row under its own key sends a key the
// receiver never saw: it acts again whatever its guarantee. The note said what the
// guarantee means for the same key ("enforced: ... acts only once"), telling the
// operator that a second effect would not happen when it would.
func TestReplayOfARowWhoseCopyMayHaveActedSaysTheReceiverActsAgain(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook", "OUTBOX_WEBHOOK_GUARANTEE=enforced")
	d.insert(t, fixture{Key: "charge", Status: outbox.StatusDead, Attempts: 3, LastError: "503"})
	code, _, errOut := d.cli(t, "", "replay", "--key", "charge", "--new-key")
	require.Equal(t, exitOK, code, errOut)
	copyKey := outbox.Key("charge", "replay", "1")
	_, err := d.pool.Exec(t.Context(), `
WITH c AS (UPDATE outbox SET status = 'canceled', attempts = 1 WHERE idempotency_key = $1 RETURNING id)
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
SELECT id, 1, 'relay-1', now(), now(), 'retry', true, 'timeout' FROM c`, copyKey)
	require.NoError(t, err)

	requireActsAgainNote(t, d, "--key", "charge", "--reason", "once more")
}

// requireActsAgainNote runs replay with args, as a dry run and then for real, and checks
// that each says the receiver acts again (a new key), not the enforced guarantee's note.
func requireActsAgainNote(t *testing.T, d *opsDB, args ...string) {
	t.Helper()
	for _, dry := range []bool{true, false} {
		a := append([]string{"replay"}, args...)
		if dry {
			a = append(a, "--dry-run")
		}
		code, out, errOut := d.cli(t, "", a...)
		require.Equal(t, exitOK, code, errOut)
		require.NotContains(t, out, ops.GuaranteeNote(connectors.Enforced), "dry run %v", dry)
		require.Contains(t, out, "webhook: a new key, so the receiver acts again whatever its guarantee (enforced)",
			"dry run %v", dry)
	}
}

// A row whose receiver has forgotten its key (Stripe: 24 hours after the row's first
// attempt, less the attempt's time limit) is not sent again under that key: a relay holds
// it at its claim. A replay under its own key said "replayed", and the row was held again
// at once, having spent an attempt; it is refused instead, saying why and what to do, and
// --new-key, whose copy is a new key, still re-executes it. A row inside its window, or of
// a receiver that does not forget keys, is replayed as before. The window is known from
// the configuration, as a relay's, and of a payment row without it too.
func TestReplayPastTheKeyWindowIsRefused(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_PAYMENT_API_KEY=sk_test_x", "OUTBOX_PAYMENT_TIMEOUT=20s",
		"OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook", "OUTBOX_WEBHOOK_GUARANTEE=enforced")
	payload := `{"operation": "refund.create", "params": {"payment_intent": "pi_1"}}`
	for _, f := range []struct {
		key, connector, status string
		firstAgo               time.Duration
	}{
		{"p-held-old", "payment", outbox.StatusHeld, 25 * time.Hour},
		// Inside the window by the clock, but an attempt of up to 20s started now could
		// end after it.
		{"p-dead-edge", "payment", outbox.StatusDead, 24*time.Hour - 10*time.Second},
		{"p-dead-new", "payment", outbox.StatusDead, time.Hour},
		{"w-dead-old", "webhook", outbox.StatusDead, 48 * time.Hour},
	} {
		p := `{"n": 1}`
		if f.connector == "payment" {
			p = payload
		}
		id := d.insert(t, fixture{Key: f.key, Connector: f.connector, Status: f.status, Attempts: 2,
			Ambiguous: f.status == outbox.StatusHeld, LastError: "attempt 2: timeout", Payload: p})
		_, err := d.pool.Exec(t.Context(), `UPDATE outbox SET first_attempt_at = clock_timestamp() - $2::interval WHERE id = $1`,
			id, f.firstAgo)
		require.NoError(t, err)
	}

	code, out, errOut := d.cli(t, "", "replay", "--key", "p-held-old", "--key", "p-dead-edge", "--key", "p-dead-new",
		"--key", "w-dead-old", "--reason", "stripe is back")
	require.Equal(t, exitFailure, code, out)
	require.Contains(t, out, "replayed: 2\n  p-dead-new\n  w-dead-old\n")
	require.Regexp(t, `(?m)^  p-held-old: past its key window: payment remembers idempotency keys for 24h0m0s and the row's first attempt `+
		`was at \S+, so a relay would hold it again without sending it .*; check the receiver for what its attempts did, `+
		`then replay it with NewKey \(--new-key\) to act, or cancel it$`, out)
	require.Regexp(t, `(?m)^  p-dead-edge: past its key window: .*then replay it with NewKey \(--new-key\) to act$`, out)
	require.Contains(t, errOut, "2 of the keys given were not replayed (0 not found, 2 refused)")
	require.Equal(t, outbox.StatusHeld, d.status(t, "p-held-old"))
	require.Equal(t, outbox.StatusDead, d.status(t, "p-dead-edge"))
	require.Equal(t, outbox.StatusPending, d.status(t, "p-dead-new"))
	require.Equal(t, outbox.StatusPending, d.status(t, "w-dead-old"))
	require.Zero(t, d.count(t, `SELECT count(*) FROM outbox_audit a JOIN outbox o ON o.id = a.outbox_id
		WHERE o.idempotency_key IN ('p-held-old', 'p-dead-edge')`))

	// Without the payment instance's variables, a payment row's window is Stripe's all
	// the same.
	code, out, _ = runCLI(t, []string{"OUTBOX_DATABASE_URL=" + d.dsn}, strings.NewReader(""),
		"replay", "--key", "p-held-old", "--dry-run")
	require.Equal(t, exitFailure, code, out)
	require.Contains(t, out, "would replay: 0\n")
	require.Contains(t, out, "p-held-old: past its key window")

	// A new key is a key the receiver has not seen: the copy goes out.
	code, out, errOut = d.cli(t, "", "replay", "--key", "p-held-old", "--new-key", "--reason", "checked stripe: no refund")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "replayed: 1\n  p-held-old -> p-held-old/replay/1~")
}

// The notes on what redelivering means name only the connectors of delivered rows the
// replay sends: a delivered row it refuses (here, its payload purged) is not sent, and
// "redelivering sends delivered rows again" about its connector warned of a send that
// would not happen.
func TestRedeliverNotesLeaveOutRefusedRows(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook", "OUTBOX_WEBHOOK_GUARANTEE=enforced")
	d.insert(t, fixture{Key: "purged", Connector: "slack", Status: outbox.StatusDelivered, Age: 2 * time.Hour})
	d.insert(t, fixture{Key: "kept", Status: outbox.StatusDelivered, Age: time.Minute})
	code, _, errOut := d.cli(t, "", "purge", "--older-than", "1h", "--payload-only")
	require.Equal(t, exitOK, code, errOut)

	// By key: the purged row alone is refused, and nothing is explained.
	code, out, errOut := d.cli(t, "", "replay", "--key", "purged", "--redeliver", "--dry-run")
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, out, "refused: 1\n  purged: ")
	require.NotContains(t, out, "redelivering")

	// By filter: only the row sent is explained.
	code, out, errOut = d.cli(t, "", "replay", "--status", "delivered", "--redeliver", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would replay: 1\n  kept\n")
	require.Contains(t, out, "webhook: "+ops.GuaranteeNote(connectors.Enforced))
	require.NotContains(t, out, "slack")

	code, out, errOut = d.cli(t, "", "replay", "--status", "delivered", "--redeliver", "--dry-run", "--json")
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "slack")
}

// TestReplayInterruptedReportsWhatItDid: a paced replay (--rate) over many rows runs
// for minutes, and SIGINT or SIGTERM killed it with Go's default, saying nothing of the
// rows it had put back. It now stops between batches, reports what it replayed as at
// the end, says it was interrupted, and exits 1; the rows it did not reach are as they
// were.
func TestReplayInterruptedReportsWhatItDid(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			d := newOpsDB(t)
			for _, k := range []string{"k-1", "k-2", "k-3"} {
				d.insert(t, fixture{Key: k, Status: outbox.StatusDead, Attempts: 3})
			}
			// A replay's batch that puts rows back notifies at its commit.
			conn, err := d.pool.Acquire(t.Context())
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(t.Context(), `LISTEN outbox`)
			require.NoError(t, err)

			// One row a batch, the next batch due 1000 s after the first.
			c := startChild(t, "replay --status dead --yes --rate 0.001 --batch-size 1", "OUTBOX_DATABASE_URL="+d.dsn)
			ctx, cancel := context.WithTimeout(t.Context(), processWait)
			defer cancel()
			_, err = conn.Conn().WaitForNotification(ctx)
			require.NoError(t, err, "the first batch did not commit")
			c.interrupt(t, sig)

			require.Equal(t, exitFailure, c.cmd.ProcessState.ExitCode(), c.stderr.String())
			require.Equal(t, "replayed: 1\n  k-1\nunchanged: 0\nrefused: 0\n", c.stdout.String()) // as at the end
			require.Contains(t, c.stderr.String(),
				"outboxd: replay interrupted: 2 rows not reached were left as they were; run it again to replay them\n")
			require.Equal(t, outbox.StatusPending, d.status(t, "k-1"))
			require.Equal(t, outbox.StatusDead, d.status(t, "k-2"))
			require.Equal(t, outbox.StatusDead, d.status(t, "k-3"))
		})
	}
}
