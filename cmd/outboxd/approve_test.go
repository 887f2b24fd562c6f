package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/outbox"
)

func TestApproveReject(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "a1", Status: outbox.StatusAwaitingApproval})
	d.insert(t, fixture{Key: "a2", Status: outbox.StatusAwaitingApproval})

	code, out, errOut := d.cli(t, "", "approve", "a1", "--reason", "checked")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "a1: pending\n", out)
	code, out, errOut = d.cli(t, "", "approve", "a1", "--json")
	require.Equal(t, 0, code, errOut)
	var in outbox.Intent
	require.NoError(t, json.Unmarshal([]byte(out), &in))
	require.Equal(t, outbox.StatusPending, in.Status)

	code, out, errOut = d.cli(t, "", "reject", "a2")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "a2: canceled\n", out)
	code, _, errOut = d.cli(t, "", "approve", "a2")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "cannot be approved")
	code, _, errOut = d.cli(t, "", "reject", "a1")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "past approval")

	var actor string
	require.NoError(t, d.pool.QueryRow(t.Context(),
		`SELECT a.actor FROM outbox_audit a JOIN outbox o ON o.id = a.outbox_id WHERE o.idempotency_key = 'a1'`).Scan(&actor))
	require.Equal(t, "alice", actor)

	code, _, _ = d.cli(t, "", "approve", "missing")
	require.Equal(t, 1, code)
	code, _, _ = d.cli(t, "", "approve")
	require.Equal(t, 2, code)
	code, _, _ = d.cli(t, "", "reject", "a1", "a2")
	require.Equal(t, 2, code)
}

func TestTokenNew(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, nil, strings.NewReader(""), "token", "new", "--name", "agent", "--connectors", "webhook:crm,slack", "--admin")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	secret, ok := strings.CutPrefix(lines[0], "token: ")
	require.True(t, ok, out)
	require.True(t, strings.HasPrefix(secret, "obx_"))
	entry := lines[len(lines)-1]
	toks, err := intent.ParseTokens("[" + entry + "]")
	require.NoError(t, err, entry)
	sum := sha256.Sum256([]byte(secret))
	require.Equal(t, []intent.Token{{Name: "agent", SHA256: hex.EncodeToString(sum[:]), Connectors: []string{"webhook:crm", "slack"}, Admin: true}}, toks)
	tok, err := (&intent.Policy{Tokens: toks}).Authenticate(secret)
	require.NoError(t, err)
	require.Equal(t, "agent", tok.Name)
	require.Equal(t, 1, strings.Count(out, secret), "the secret is printed once")

	code, _, _ = runCLI(t, nil, strings.NewReader(""), "token", "new", "--connectors", "webhook")
	require.Equal(t, 2, code)
	code, _, errOut = runCLI(t, nil, strings.NewReader(""), "token", "new", "--name", "x", "--connectors", "Bad!")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "malformed")
}

// Approving a held or dead row changes nothing (approving twice is harmless), and the
// command says what would act on it: "KEY: held" alone, exit 0, read to an operator
// clearing the rows status reports stuck as though the row had been let go.
func TestApproveHeldOrDeadSaysWhatActsOnIt(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "h1", Status: outbox.StatusHeld})
	d.insert(t, fixture{Key: "d1", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "p1", Status: outbox.StatusPending})

	code, out, errOut := d.cli(t, "", "approve", "h1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "h1: held\n", out)
	require.Contains(t, errOut, "h1 is held, not awaiting approval, and approve changed nothing")
	require.Contains(t, errOut, "outboxd replay --key")
	require.Contains(t, errOut, "outboxd cancel")

	code, out, errOut = d.cli(t, "", "approve", "d1", "--json")
	require.Equal(t, 0, code, errOut)
	var in outbox.Intent
	require.NoError(t, json.Unmarshal([]byte(out), &in), out)
	require.Equal(t, outbox.StatusDead, in.Status)
	require.Contains(t, errOut, "d1 is dead, not awaiting approval, and approve changed nothing")

	code, out, errOut = d.cli(t, "", "approve", "p1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "p1: pending\n", out)
	require.Empty(t, errOut)

	var status string
	require.NoError(t, d.pool.QueryRow(t.Context(), `SELECT status FROM outbox WHERE idempotency_key = 'h1'`).Scan(&status))
	require.Equal(t, outbox.StatusHeld, status)
}
