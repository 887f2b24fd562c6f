package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// pgx reads a timestamptz in the process's zone (time.Local; here the connection's
// ScanLocation). A NotBefore in the last hours of year 9999 (an API or MCP not_before
// of 9999-12-31T23:30:00Z) is year 10000 east of UTC, and the Intent Enqueue returned
// did not encode: the API answered 500 for the intent it had just written.
func TestEnqueueReturnsTimesThatEncodeInAnyZone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	conn.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID,
		Codec: &pgtype.TimestamptzCodec{ScanLocation: time.FixedZone("UTC+14", 14*3600)}})

	late := time.Date(9999, 12, 31, 23, 30, 0, 0, time.UTC)
	in, err := outbox.Enqueue(ctx, conn, outbox.Message{Key: "late", Connector: "webhook", Payload: map[string]any{}, NotBefore: late})
	require.NoError(t, err)
	require.True(t, in.Inserted)
	require.True(t, in.NextAttemptAt.Equal(late), "%s", in.NextAttemptAt)
	_, err = json.Marshal(in)
	require.NoError(t, err)
}
