package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// An instance's guarantee is unknown when the OUTBOX_* variables do not load (here an
// instance OUTBOX_CONNECTORS names without its URL, beside a webhook whose variables are
// all set). status, replay and cancel said "-" and "its OUTBOX_* variables are not
// set", which sent the operator looking at variables that were set; they now say the
// variables do not load, and a warning names the problems, as serve would.
func TestGuaranteesSayWhenTheVariablesDoNotLoad(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook", "OUTBOX_WEBHOOK_GUARANTEE=enforced",
		"OUTBOX_CONNECTORS=webhook:crm")
	d.insert(t, fixture{Key: "h1", Status: outbox.StatusHeld, Ambiguous: true, Attempts: 1, LastError: "connection reset"})
	d.insert(t, fixture{Key: "p1", Status: outbox.StatusPending, Ambiguous: true, Attempts: 1, LastError: "connection reset"})
	const warning = "outboxd: warning: no receiver's guarantee is known here, as the OUTBOX_* variables do not load " +
		"(serve would refuse them too):\n- OUTBOX_WEBHOOK_CRM_URL is required for webhook:crm, which OUTBOX_CONNECTORS names\n"

	code, out, errOut := d.cli(t, "", "status")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, warning, errOut)
	require.Regexp(t, `(?m)^webhook +- `, out)

	code, out, errOut = d.cli(t, "", "replay", "--key", "h1", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, warning, errOut)
	require.Contains(t, out, "webhook: guarantee unknown here (the OUTBOX_* variables here do not load): assume the receiver may act twice")
	require.NotContains(t, out, "not set")

	code, out, errOut = d.cli(t, "", "cancel", "p1")
	require.Equal(t, exitOK, code, errOut)
	require.True(t, strings.HasPrefix(errOut, warning), errOut)
	require.Contains(t, out, "webhook: guarantee unknown here (the OUTBOX_* variables here do not load): check the receiver itself")

	// Variables that load say the guarantee, with no warning.
	d.environ = d.environ[:len(d.environ)-1]
	code, out, errOut = d.cli(t, "", "status")
	require.Equal(t, exitOK, code, errOut)
	require.Empty(t, errOut)
	require.Regexp(t, `(?m)^webhook +enforced `, out)
}
