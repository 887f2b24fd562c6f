package ops_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// pgx reads a timestamptz in the process's time zone (time.Local, here the ScanLocation
// of a connection's own). Near the ends of the years JSON can carry, the zone's offset
// carries a time past them: 9999-12-31 23:30Z is 10000-01-01 at +14:00, 0000-01-01
// 05:00Z is year -1 at -12:00. Such a row made inspect --json, list --json and the API's
// and MCP's answers fail ("year outside of range [0,9999]") for an operator or a server
// east or west of UTC, though the same row read fine in UTC.
func TestInspectTimesEncodeInAnyZone(t *testing.T) {
	t.Parallel()
	dsn := pgtest.URL(t)
	late := time.Date(9999, 12, 31, 23, 30, 0, 0, time.UTC)
	early := time.Date(0, 1, 1, 5, 0, 0, 0, time.UTC)
	for _, zone := range []*time.Location{time.FixedZone("UTC+14", 14*3600), time.FixedZone("UTC-12", -12*3600)} {
		conn, err := pgx.Connect(t.Context(), dsn)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(t.Context())) })
		conn.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID,
			Codec: &pgtype.TimestamptzCodec{ScanLocation: zone}})
		for key, at := range map[string]time.Time{"late-" + zone.String(): late, "early-" + zone.String(): early} {
			_, err := conn.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, created_at, next_attempt_at, first_attempt_at)
VALUES ($1, 'webhook', '{}', $2, $2, $2)`, key, at)
			require.NoError(t, err)
			d, err := ops.Inspect(t.Context(), conn, key)
			require.NoError(t, err)
			_, err = json.Marshal(d)
			require.NoError(t, err, key)
			for _, got := range []time.Time{d.Intent.CreatedAt, d.Intent.NextAttemptAt, d.FirstAttemptAt} {
				require.True(t, got.Equal(at), "%s: %s, want %s", key, got, at)
			}
		}
	}
}
