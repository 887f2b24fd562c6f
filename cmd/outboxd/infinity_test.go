package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// Plain SQL may write ±infinity into created_at or next_attempt_at (a row parked with
// next_attempt_at 'infinity', say); the relay and status take such rows. One of them made
// list, inspect and a filtered replay fail altogether ("cannot scan Infinity into
// *time.Time"), so the operator could not see or repair any row beside it. Every row is
// listed once, page after page, and can be inspected and replayed.
func TestListInspectReplayTakeInfiniteTimes(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "finite", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "parked", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "from-minus", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "from-plus", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "from-minus-2", Status: outbox.StatusDead})
	_, err := d.pool.Exec(t.Context(), `
UPDATE outbox SET next_attempt_at = 'infinity' WHERE idempotency_key = 'parked';
UPDATE outbox SET created_at = '-infinity', next_attempt_at = '-infinity' WHERE idempotency_key LIKE 'from-minus%';
UPDATE outbox SET created_at = 'infinity' WHERE idempotency_key = 'from-plus';`)
	require.NoError(t, err)

	seen := map[string]int{}
	for _, k := range listPageByPage(t, d) {
		seen[k]++
	}
	require.Equal(t, map[string]int{"finite": 1, "parked": 1, "from-minus": 1, "from-plus": 1, "from-minus-2": 1}, seen)

	code, out, errOut := d.cli(t, "", "list")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "from-minus-2")
	for _, k := range []string{"parked", "from-minus", "from-plus"} {
		code, _, errOut = d.cli(t, "", "inspect", k)
		require.Equal(t, exitOK, code, "%s: %s", k, errOut)
		code, out, errOut = d.cli(t, "", "inspect", k, "--json")
		require.Equal(t, exitOK, code, "%s: %s", k, errOut)
		require.True(t, json.Valid([]byte(out)), out)
	}

	code, out, errOut = d.cli(t, "", "replay", "--status", "dead", "--reason", "parked by hand")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "replayed: 5\n")
}

// Plain SQL may also write finite times that JSON cannot carry: PostgreSQL takes years
// from 4713 BC to 294276 AD, encoding/json only 0 to 9999. One such row made list --json
// and inspect --json fail ("year outside of range [0,9999]"), and ended list's paging at
// it without a word (its cursor did not encode), so the rows after it were never shown.
func TestListInspectTakeYearsJSONCannotCarry(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "newest", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "far-future", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "in-between", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "before-christ", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "oldest", Status: outbox.StatusDead})
	_, err := d.pool.Exec(t.Context(), `
UPDATE outbox SET created_at = '294276-12-31 23:59:59.999998Z' WHERE idempotency_key = 'newest';
UPDATE outbox SET created_at = '294276-12-31 23:59:59.999999Z', next_attempt_at = '294276-01-01' WHERE idempotency_key = 'far-future';
UPDATE outbox SET created_at = '4713-01-01 BC', next_attempt_at = '4713-01-01 BC' WHERE idempotency_key = 'before-christ';
UPDATE outbox SET created_at = '4713-01-01 00:00:00.5Z BC' WHERE idempotency_key = 'oldest';
UPDATE outbox SET created_at = '2000-01-01' WHERE idempotency_key = 'in-between';`)
	require.NoError(t, err)

	require.Equal(t, []string{"far-future", "newest", "in-between", "oldest", "before-christ"}, listPageByPage(t, d))

	for _, k := range []string{"far-future", "before-christ"} {
		code, out, errOut := d.cli(t, "", "inspect", k, "--json")
		require.Equal(t, exitOK, code, "%s: %s", k, errOut)
		require.True(t, json.Valid([]byte(out)), out)
	}
}

// listPageByPage follows list --json --limit 1 from page to page, for at most 10 pages,
// and gives the keys in the order listed.
func listPageByPage(t *testing.T, d *opsDB) []string {
	t.Helper()
	var keys []string
	after := ""
	for range 10 {
		args := []string{"list", "--limit", "1", "--json"}
		if after != "" {
			args = append(args, "--after", after)
		}
		code, out, errOut := d.cli(t, "", args...)
		require.Equal(t, exitOK, code, errOut)
		var page struct {
			Intents []outbox.Intent `json:"intents"`
			Next    string          `json:"next"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &page), out)
		for _, in := range page.Intents {
			keys = append(keys, in.Key)
		}
		if after = page.Next; after == "" {
			break
		}
	}
	return keys
}
