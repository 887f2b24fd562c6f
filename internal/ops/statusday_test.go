package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// Status's dead rows of the last day are those of the last 24 hours, in any session time
// zone: the day after clocks go forward, a calendar day back from noon in Paris is 23
// hours, and a row that went dead 23.5 hours before was neither counted in DEAD 24H nor
// raised the dead-letters verdict.
func TestStatusDeadLastDayIs24HoursAcrossADaylightSavingChange(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	_, err := tx.Exec(t.Context(), `SET LOCAL TimeZone = 'Europe/Paris'`)
	require.NoError(t, err)
	// Clocks went forward in Paris at 02:00 on 2030-03-31.
	now := time.Date(2030, 3, 31, 10, 0, 0, 0, time.UTC) // noon in Paris
	for key, ago := range map[string]time.Duration{"dead-23h30": 23*time.Hour + 30*time.Minute, "dead-24h30": 24*time.Hour + 30*time.Minute} {
		_, err = tx.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, created_at, updated_at)
VALUES ($1, 'webhook', '{}', 'dead', 1, $2, $2)`, key, now.Add(-ago))
		require.NoError(t, err)
	}
	rep, err := ops.Status(t.Context(), tx, now)
	require.NoError(t, err)
	require.Len(t, rep.Connectors, 1)
	require.Equal(t, 1, rep.Connectors[0].DeadLastDay, "the row dead 23.5 hours ago, not the one dead 24.5")
	require.Equal(t, ops.VerdictDead, rep.Verdict)
}
