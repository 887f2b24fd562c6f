package relay

import (
	"bytes"
	"encoding/json"
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

	var warned []map[string]any
	for line := range bytes.Lines(logs.Bytes()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(line, &rec), "%s", line)
		if rec["level"] == "WARN" {
			warned = append(warned, rec)
		}
	}
	require.Len(t, warned, 1, "%s", logs.String())
	require.NotContains(t, warned[0]["msg"], "rows put back", "no row was put back: %s", logs.String())
	require.EqualValues(t, 1, warned[0]["held"], "%s", logs.String())
	require.EqualValues(t, 1, warned[0]["dead"], "%s", logs.String())
	require.Contains(t, warned[0]["msg"], "replay", "what to do with them: %s", logs.String())
}
