package main

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// A cancel of more keys than one batch (500) whose second batch fails has already
// committed the first: the command must say which rows it canceled, as replay does,
// instead of only the error.
func TestCancelFailingLaterBatchReportsEarlierBatches(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	_, err := d.pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload)
SELECT 'c-' || i, 'webhook', '{}' FROM generate_series(1, 501) i`)
	require.NoError(t, err)
	failOn(t, d, "UPDATE", "c-501") // the second batch fails in the database

	args := []string{"cancel", "--json"}
	for i := 1; i <= 501; i++ {
		args = append(args, fmt.Sprintf("c-%d", i))
	}
	code, out, errOut := d.cli(t, "", args...)
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, errOut, "injected failure")
	// The first batch was committed.
	require.Equal(t, outbox.StatusCanceled, d.status(t, "c-1"))
	require.Equal(t, 500, d.count(t, `SELECT count(*) FROM outbox WHERE status = 'canceled'`))
	// ...and the output says so.
	var res ops.CancelResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), "stdout: %q", out)
	require.Len(t, res.Canceled, 500)

	// The text output too.
	_, err = d.pool.Exec(t.Context(), `UPDATE outbox SET status = 'pending' WHERE idempotency_key <> 'c-501'`)
	require.NoError(t, err)
	textArgs := append([]string{"cancel"}, args[2:]...)
	code, out, errOut = d.cli(t, "", textArgs...)
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, out, "canceled: 500\n  c-1\n")
}

// A purge whose later batch fails has already deleted the earlier batches' rows: the
// command must say how many, not only the error.
func TestPurgeFailingLaterBatchReportsEarlierBatches(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "p-1", Status: outbox.StatusDelivered, Age: 3 * time.Hour})
	d.insert(t, fixture{Key: "p-2", Status: outbox.StatusDelivered, Age: 2 * time.Hour})
	failOn(t, d, "DELETE", "p-2")

	code, out, errOut := d.cli(t, "", "purge", "--older-than", "1h", "--batch-size", "1", "--json")
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, errOut, "injected failure")
	require.Equal(t, 1, d.count(t, `SELECT count(*) FROM outbox`)) // p-1 is gone
	var res purgeJSON
	require.NoError(t, json.Unmarshal([]byte(out), &res), "stdout: %q", out)
	require.Equal(t, 1, res.Rows)
}

// failOn makes the database fail every event ("UPDATE" or "DELETE") of the outbox row
// with key, with the error "injected failure".
func failOn(t *testing.T, d *opsDB, event, key string) {
	t.Helper()
	row := map[string]string{"UPDATE": "NEW", "DELETE": "OLD"}[event]
	_, err := d.pool.Exec(t.Context(), fmt.Sprintf(`
CREATE FUNCTION fail_on() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF %[1]s.idempotency_key = %[2]s THEN RAISE EXCEPTION 'injected failure'; END IF;
    RETURN %[1]s;
END $$;
CREATE TRIGGER fail_on BEFORE %[3]s ON outbox FOR EACH ROW EXECUTE FUNCTION fail_on();`,
		row, "'"+key+"'", event))
	require.NoError(t, err)
}
