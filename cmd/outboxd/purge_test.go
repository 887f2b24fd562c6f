package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPurge(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t) // every row is an hour old, s-dead two days
	d.insert(t, fixture{Key: "old-delivered", Status: "delivered", Age: 30 * 24 * time.Hour})
	d.insert(t, fixture{Key: "old-canceled", Status: "canceled", Age: 30 * 24 * time.Hour})
	d.insert(t, fixture{Key: "old-pending", Status: "pending", Age: 30 * 24 * time.Hour})
	d.insert(t, fixture{Key: "old-dead", Status: "dead", Age: 30 * 24 * time.Hour})
	total := d.count(t, `SELECT count(*) FROM outbox`)

	code, out, errOut := d.cli(t, "", "purge", "--older-than", "168h", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "dry run: would delete 2 rows\n", out)
	require.Equal(t, total, d.count(t, `SELECT count(*) FROM outbox`))

	code, out, errOut = d.cli(t, "", "purge", "--older-than", "30m", "--payload-only", "--json")
	require.Equal(t, exitOK, code, errOut)
	var res struct {
		Rows        int  `json:"rows"`
		DryRun      bool `json:"dry_run"`
		PayloadOnly bool `json:"payload_only"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, 4, res.Rows) // k-delivered, k-canceled, old-delivered, old-canceled
	require.True(t, res.PayloadOnly)
	require.Equal(t, total, d.count(t, `SELECT count(*) FROM outbox`))

	code, out, errOut = d.cli(t, "", "purge", "--older-than", "30m")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "deleted 4 rows\n", out)
	require.Equal(t, total-4, d.count(t, `SELECT count(*) FROM outbox`))
	// Nothing but delivered and canceled rows went.
	require.Zero(t, d.count(t, `SELECT count(*) FROM outbox WHERE status IN ('delivered', 'canceled')`))
	require.Equal(t, total-4, d.count(t, `SELECT count(*) FROM outbox WHERE status NOT IN ('delivered', 'canceled')`))
	require.Equal(t, 1, d.count(t, `SELECT count(*) FROM outbox WHERE idempotency_key = 'old-pending'`))
	require.Equal(t, 1, d.count(t, `SELECT count(*) FROM outbox WHERE idempotency_key = 'old-dead'`))
}

// --reason is recorded only with --payload-only: a deleted row keeps no audit trail. An
// operator who gave a reason for a delete (purge --older-than 24h --reason "GDPR
// erasure", meaning to add --payload-only) had the rows deleted and the reason dropped
// without a word; the flags conflict, which is a usage error before anything changes.
func TestPurgeReasonNeedsPayloadOnly(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "old-delivered", Status: "delivered", Age: 48 * time.Hour})
	code, _, errOut := d.cli(t, "", "purge", "--older-than", "24h", "--reason", "GDPR erasure")
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "--payload-only")
	require.Equal(t, 1, d.count(t, `SELECT count(*) FROM outbox`))
}

// inspect says a payload was emptied by purge --payload-only: it showed the {} left
// behind as "payload:", which read as the request the application had made.
func TestInspectSaysThePayloadWasPurged(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "gone", Status: "delivered", Age: 2 * time.Hour})
	d.insert(t, fixture{Key: "empty", Status: "delivered", Age: time.Minute, Payload: `{}`})

	code, _, errOut := d.cli(t, "", "purge", "--older-than", "1h", "--payload-only")
	require.Equal(t, exitOK, code, errOut)

	code, out, errOut := d.cli(t, "", "inspect", "gone")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `\npayload \(emptied by outboxd purge --payload-only at \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\):\n  \{\}\n`, out)

	// A payload that was {} all along is shown as it is.
	code, out, errOut = d.cli(t, "", "inspect", "empty")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "\npayload:\n  {}\n")
}
