package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

func TestCancel(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)

	code, out, errOut := d.cli(t, "", "cancel", "k-pending", "k-awaiting", "--reason", "refunded")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "canceled: 2\n  k-pending\n  k-awaiting\n")
	require.Equal(t, outbox.StatusCanceled, d.status(t, "k-pending"))
	require.Equal(t, 2, d.count(t, `SELECT count(*) FROM outbox_audit WHERE action = 'cancel' AND actor = 'alice' AND reason = 'refunded'`))

	// Unknown and refused keys: the others are still canceled, then exit 1.
	code, out, errOut = d.cli(t, "", "cancel", "--json", "k-held", "k-delivered", "k-delivering", "k-canceled", "missing")
	require.Equal(t, exitFailure, code)
	var res ops.CancelResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, []string{"k-held"}, res.Canceled)
	require.Equal(t, []string{"k-canceled"}, res.Unchanged)
	require.Equal(t, []string{"missing"}, res.NotFound)
	require.Contains(t, res.Refused["k-delivered"], "already delivered")
	require.Contains(t, res.Refused["k-delivering"], "in flight")
	require.Contains(t, errOut, "3 of the keys given were not canceled (1 not found, 2 refused)")
	require.Equal(t, outbox.StatusCanceled, d.status(t, "k-held"))
	require.Equal(t, outbox.StatusDelivered, d.status(t, "k-delivered"))
}

// A cancel that fails before any of its batches committed prints no result: it printed
// "canceled: 0", "unchanged: 0", "refused: 0" (with --json, an empty result a script
// would take for the answer) above the error, and the key given was in none of them.
func TestCancelThatChangedNothingPrintsNoResult(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	reader := roleEnv(t, d, "outboxd_reader_", `GRANT SELECT ON outbox, outbox_attempts, outbox_audit TO ROLE_`)
	for _, args := range [][]string{{"cancel", "k-pending"}, {"cancel", "k-pending", "--json"}} {
		code, out, errOut := runCLI(t, reader, strings.NewReader(""), args...)
		require.Equal(t, exitFailure, code, args)
		require.Contains(t, errOut, "permission denied for table outbox", args)
		require.Empty(t, out, args)
	}
	require.Equal(t, outbox.StatusPending, d.status(t, "k-pending"))
}

// cancel said "canceled" of a held row, or of a pending one reclaimed after its relay's
// lease expired, as of one never sent, and its help promised canceled rows "are never
// sent": an earlier attempt may have reached the receiver, which may have acted already.
// It now warns of each such key, with what the guarantee says about finding out, and
// still cancels it and exits 0.
func TestCancelWarnsWhereTheReceiverMayHaveActed(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook") // forwarded, the default
	d.insert(t, fixture{Key: "held", Status: outbox.StatusHeld, Ambiguous: true, Attempts: 1, LastError: "timeout"})
	d.insert(t, fixture{Key: "reclaimed", Connector: "slack", Status: outbox.StatusPending, Ambiguous: true, Attempts: 1})
	d.insert(t, fixture{Key: "fresh", Status: outbox.StatusPending})
	d.insert(t, fixture{Key: "held-json", Status: outbox.StatusHeld, Ambiguous: true, Attempts: 1, LastError: "timeout"})

	code, out, errOut := d.cli(t, "", "cancel", "held", "reclaimed", "fresh")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "canceled: 3\n")
	require.Contains(t, out, "warning: held (webhook): held after an attempt that may have reached the receiver")
	require.Contains(t, out, "warning: reclaimed (slack): pending after an attempt")
	require.NotContains(t, out, "warning: fresh", "never attempted")
	require.Contains(t, out, "\n  webhook: forwarded: ")
	require.Contains(t, out, "\n  slack: guarantee unknown here")
	require.Equal(t, outbox.StatusCanceled, d.status(t, "held"))

	code, out, errOut = d.cli(t, "", "cancel", "--json", "held-json", "fresh")
	require.Equal(t, exitOK, code, errOut)
	var res struct {
		MayHaveActed map[string]struct {
			Connector string `json:"connector"`
			Reason    string `json:"reason"`
		} `json:"may_have_acted"`
		Notes []string `json:"may_have_acted_notes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Len(t, res.MayHaveActed, 1, out)
	require.Equal(t, "webhook", res.MayHaveActed["held-json"].Connector)
	require.Contains(t, res.MayHaveActed["held-json"].Reason, "may have reached the receiver")
	require.Len(t, res.Notes, 1)
	require.Contains(t, res.Notes[0], "webhook: forwarded: ")
}

// The help no longer promises that canceled rows are never sent.
func TestCancelHelpDoesNotPromiseNeverSent(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, nil, strings.NewReader(""), "cancel", "--help")
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "never sent")
	require.Contains(t, out, "may have reached the receiver")
}
