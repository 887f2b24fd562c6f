package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

func TestList(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)

	code, out, errOut := d.cli(t, "", "list", "--status", "dead,held", "--connector", "webhook")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^KEY\s+CONNECTOR\s+STATUS\s+ATTEMPTS\s+CREATED\s+NEXT ATTEMPT\s+LAST ERROR$`, out)
	require.Regexp(t, `(?m)^k-dead\s+webhook\s+dead\s+3\s+\S+ \S+\s+-\s+receiver answered 422 Unprocessable Entity$`, out)
	require.Regexp(t, `(?m)^k-held\s+webhook\s+held\s+1\s`, out)
	require.NotContains(t, out, "s-dead")
	require.NotContains(t, out, "next page")

	// Repeated --status, --error-contains, and JSON.
	code, out, errOut = d.cli(t, "", "list", "--status", "dead", "--status", "held", "--error-contains", "CHANNEL", "--json")
	require.Equal(t, exitOK, code, errOut)
	var page struct {
		Intents []outbox.Intent `json:"intents"`
		Next    *string         `json:"next"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Len(t, page.Intents, 1)
	require.Equal(t, "s-dead", page.Intents[0].Key)
	require.NotNil(t, page.Next)
	require.Empty(t, *page.Next)

	// Nothing matches: an empty list, not null, and exit 1 with one line, like grep.
	code, out, errOut = d.cli(t, "", "list", "--key-prefix", "nope", "--json")
	require.Equal(t, exitFailure, code, errOut)
	require.JSONEq(t, `{"intents": [], "next": ""}`, out)
	require.Equal(t, "outboxd: no intents match the filters\n", errOut)
	code, out, errOut = d.cli(t, "", "list", "--key-prefix", "nope")
	require.Equal(t, exitFailure, code)
	require.Equal(t, "no intents match\n", out)
	require.Equal(t, "outboxd: no intents match the filters\n", errOut) // a read: it never says what it did not change

	// Age filters: only s-dead is older than a day.
	code, out, errOut = d.cli(t, "", "list", "--older-than", "24h")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^s-dead\s`, out)
	require.NotContains(t, out, "k-dead")
	code, out, _ = d.cli(t, "", "list", "--newer-than", "90m", "--ordering-key", "none")
	require.Equal(t, exitFailure, code)
	require.Equal(t, "no intents match\n", out)

	// An unknown status or a bad cursor is a usage error.
	code, _, errOut = d.cli(t, "", "list", "--status", "lost")
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, `unknown status "lost"`)
	code, _, _ = d.cli(t, "", "list", "--after", "garbage")
	require.Equal(t, exitUsage, code)
}

func TestListPages(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	for i := range 5 {
		d.insert(t, fixture{Key: fmt.Sprintf("p-%d", i), Age: time.Duration(10-i) * time.Minute})
	}
	code, out, errOut := d.cli(t, "", "list", "--limit", "2")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?s)p-4.*p-3`, out) // newest first
	m := regexp.MustCompile(`(?m)^next page: --after (\S+)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)

	var seen []string
	after := m[1]
	for after != "" {
		code, out, errOut = d.cli(t, "", "list", "--limit", "2", "--after", after, "--json")
		require.Equal(t, exitOK, code, errOut)
		var page struct {
			Intents []outbox.Intent `json:"intents"`
			Next    string          `json:"next"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &page))
		for _, in := range page.Intents {
			seen = append(seen, in.Key)
		}
		after = page.Next
	}
	require.Equal(t, []string{"p-2", "p-1", "p-0"}, seen)
}

// Keys run to 255 characters, and keys derived from the work share long prefixes
// (outbox.Key of a run id and step). list must show each key whole: cut at 60
// characters, two rows showed the same text, and neither could be passed to inspect.
func TestListShowsLongKeysWhole(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	prefix := strings.Repeat("run-0123456789/", 5) // 75 characters
	for _, k := range []string{prefix + "notify-crm", prefix + "notify-erp"} {
		d.insert(t, fixture{Key: k, Status: outbox.StatusDead})
	}
	code, out, errOut := d.cli(t, "", "list", "--status", "dead")
	require.Equal(t, exitOK, code, errOut)
	for _, k := range []string{prefix + "notify-crm", prefix + "notify-erp"} {
		require.Regexp(t, `(?m)^`+regexp.QuoteMeta(k)+`\s`, out)
	}
}

// A --connector that no row can have (the table's constraint allows lowercase kind or
// kind:name only) is a mistake in the command, such as webhook:CRM for webhook:crm. It
// answered "no intents match", which tells the operator there is nothing to replay
// under the connector meant.
func TestMalformedConnectorFilterIsAUsageError(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "crm-dead", Connector: "webhook:crm", Status: outbox.StatusDead})
	for _, args := range [][]string{
		{"list", "--connector", "webhook:CRM"},
		{"list", "--connector", "Webhook"},
		{"replay", "--connector", "webhook:CRM", "--status", "dead", "--yes"},
		{"replay", "--connector", "webhook crm", "--status", "dead", "--dry-run"},
	} {
		code, _, errOut := d.cli(t, "", args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "--connector", args)
	}
	require.Equal(t, outbox.StatusDead, d.status(t, "crm-dead"))
}

// --older-than 24h --newer-than 1h (meant: created between one hour and a day ago, the
// flags swapped) selects rows created before a day ago and after an hour ago: none, ever.
// It answered "no intents match", as if there were no such rows.
func TestSwappedAgeFiltersAreAUsageError(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "six-hours", Status: outbox.StatusDead, Age: 6 * time.Hour})
	for _, args := range [][]string{
		{"list", "--older-than", "24h", "--newer-than", "1h"},
		{"list", "--older-than", "1h", "--newer-than", "1h"},
		{"replay", "--older-than", "24h", "--newer-than", "1h", "--status", "dead", "--yes"},
	} {
		code, _, errOut := d.cli(t, "", args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "--older-than", args)
	}
	code, out, errOut := d.cli(t, "", "list", "--older-than", "1h", "--newer-than", "24h")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "six-hours")
}

// A row awaiting approval has a next attempt, its not-before, as inspect and enqueue
// show it; list showed "-", as for rows that will not be attempted, so an operator
// listing the rows to approve could not see which would go out only later.
func TestListShowsTheNextAttemptOfRowsAwaitingApproval(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.seedEveryState(t)
	code, out, errOut := d.cli(t, "", "list")
	require.Equal(t, exitOK, code, errOut)
	stamp := `\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ`
	for key, want := range map[string]bool{
		"k-dead": false, "k-held": false, "k-delivered": false, "k-canceled": false, "k-delivering": false,
		"k-pending": true, "k-awaiting": true,
	} {
		next := `-`
		if want {
			next = stamp
		}
		require.Regexp(t, `(?m)^`+key+`\s+webhook\s+\S+\s+\d+\s+`+stamp+`\s+`+next+`(\s|$)`, out, key)
	}
}

// --newer-than 0s selects rows created less than no time ago: none. The library takes a
// zero age for no filter, so it selected rows of every age, and replay --newer-than
// "${MINUTES}m" with MINUTES=0 replayed every dead row.
func TestZeroNewerThanIsAUsageError(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "six-hours", Status: outbox.StatusDead, Age: 6 * time.Hour})
	for _, args := range [][]string{
		{"list", "--newer-than", "0s"},
		{"list", "--older-than", "1h", "--newer-than", "0m"},
		{"replay", "--newer-than", "0s", "--status", "dead", "--yes"},
	} {
		code, out, errOut := d.cli(t, "", args...)
		require.Equal(t, exitUsage, code, "%v: %s%s", args, out, errOut)
		require.Contains(t, errOut, "--newer-than", args)
	}
	require.Equal(t, outbox.StatusDead, d.status(t, "six-hours"))
}
