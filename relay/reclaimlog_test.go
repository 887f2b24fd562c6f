package relay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// Rows whose relay lost its lease mid-attempt are not all put back: under the hold
// policy they are held for an operator, and a row that used its last attempt goes to
// dead. The warning said of all of them "rows put back", so the rows that wait for a
// person (held), or whose operation may have happened though the row is dead, were
// reported as retried, without a word of what to do. The warning now tells them apart.
func TestReclaimWarningSaysWhichRowsWereNotPutBack(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Lease = 10 * time.Second
	cfg.MaxAttempts = 1
	forwarded, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
	require.NoError(t, err)
	instances := map[string]Instance{
		"webhook":      {Connector: forwarded, OnAmbiguous: AmbiguousHold},
		"webhook:last": {Connector: b.hook},
	}
	sender := newRelayAs(t, b, cfg, instances, "sender")
	var logs bytes.Buffer
	withLog := *cfg
	withLog.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	other := newRelayAs(t, b, &withLog, instances, "other")
	enqueue(t, b.pool, "held", "webhook", []int{1})
	enqueue(t, b.pool, "dead", "webhook:last", []int{1})
	require.Len(t, claimRows(t, sender, "webhook"), 1)
	require.Len(t, claimRows(t, sender, "webhook:last"), 1)

	clock.Advance(time.Minute)
	other.reclaim(t.Context())
	for key, want := range map[string]string{"held": outbox.StatusHeld, "dead": outbox.StatusDead} {
		row, err := outbox.Get(t.Context(), b.pool, key)
		require.NoError(t, err)
		require.Equal(t, want, row.Status, key)
	}

	warned := warnings(t, &logs)
	require.Len(t, warned, 1, "%s", logs.String())
	require.NotContains(t, warned[0]["msg"], "rows put back", "no row was put back: %s", logs.String())
	require.EqualValues(t, 1, warned[0]["held"], "%s", logs.String())
	require.EqualValues(t, 1, warned[0]["dead"], "%s", logs.String())
	require.Contains(t, warned[0]["msg"], "replay", "what to do with them: %s", logs.String())
	var named []string
	for _, row := range warned[0]["first_rows"].([]any) {
		named = append(named, row.(map[string]any)["key"].(string))
	}
	require.Equal(t, []string{"held", "dead"}, named, "both, in id order: %s", logs.String())
}

// logRecords returns the records logged as JSON to logs.
func logRecords(t *testing.T, logs *bytes.Buffer) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range bytes.Lines(logs.Bytes()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(line, &rec), "%s", line)
		recs = append(recs, rec)
	}
	return recs
}

// warnings returns the warnings logged as JSON to logs.
func warnings(t *testing.T, logs *bytes.Buffer) []map[string]any {
	t.Helper()
	var warned []map[string]any
	for _, rec := range logRecords(t, logs) {
		if rec["level"] == "WARN" {
			warned = append(warned, rec)
		}
	}
	return warned
}

// The warnings about rows whose relay vanished mid-attempt gave counts alone: an
// operator who must check with the receiver whether it acted had no way to find the rows.
// Each now names the first rows by id, with their keys and what became of them, and
// says how many more there are, from the reclaim's own statement.
func TestReclaimWarningsNameTheRows(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	forwarded, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
	require.NoError(t, err)
	var logs bytes.Buffer
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	r, err := New(b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:hold": {Connector: forwarded, OnAmbiguous: AmbiguousHold},
	})
	require.NoError(t, err)

	var putBack []any
	for i := range reclaimNamed + 2 {
		in := enqueue(t, b.pool, fmt.Sprintf("order-%02d", i), "webhook", []int{i})
		if len(putBack) < reclaimNamed {
			putBack = append(putBack, map[string]any{"id": float64(in.ID), "key": in.Key, "status": "pending"})
		}
	}
	held := enqueue(t, b.pool, "held-one", "webhook:hold", []int{1})
	_, err = b.pool.Exec(t.Context(), `UPDATE outbox SET status = 'delivering', attempts = 1, lease_owner = 'gone',
		lease_expires_at = $1, updated_at = $1`, clock.Now())
	require.NoError(t, err)
	clock.Advance(time.Minute)
	r.reclaim(t.Context())

	warned := warnings(t, &logs)
	require.Len(t, warned, 2, "%s", logs.String())
	pending, waiting := warned[0], warned[1]
	require.EqualValues(t, reclaimNamed+2, pending["rows"], "%s", logs.String())
	require.Equal(t, putBack, pending["first_rows"], "the first ten by id, with their keys: %s", logs.String())
	require.EqualValues(t, 2, pending["more_rows"])
	require.EqualValues(t, 1, waiting["held"], "%s", logs.String())
	require.Equal(t, []any{map[string]any{"id": float64(held.ID), "key": "held-one", "status": "held"}}, waiting["first_rows"])
	require.EqualValues(t, 0, waiting["more_rows"])

	// A text log quotes each key, which may hold spaces.
	var text bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Warn("reclaimed", "first_rows", []reclaimedRow{{ID: 7, Key: "a b", Status: "held"}})
	require.Contains(t, text.String(), `first_rows="[{id=7 key=\"a b\" status=held}]"`)
}
