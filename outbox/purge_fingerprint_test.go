package outbox_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// a row written by plain SQL (the README's way from any language) has no
// fingerprint. After `outboxd purge --payload-only` its payload is {}, and a different
// request under its key with payload {} is taken for the same request: Enqueue answers
// with the delivered intent (Inserted false, no error) although that key named
// {"order": 42}. existingSQL's comment says the opposite: "a request with payload {} is
// not the purged row's request unless the fingerprint says so".
func TestPurgedPlainSQLRowIsNotAnEmptyRequest(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := pool.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload, status, updated_at)
		VALUES ('order-42/notify-crm', 'webhook', '{"order": 42}', 'delivered', now() - interval '2 days')`)
	require.NoError(t, err)
	res, err := ops.Purge(ctx, pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.Rows)

	in, err := outbox.Enqueue(ctx, pool, webhookMsg("order-42/notify-crm", json.RawMessage(`{}`)))
	require.ErrorIs(t, err, outbox.ErrKeyConflict,
		"a {} request matched the purged row of {\"order\": 42}: got %s intent, inserted=%v", in.Status, in.Inserted)
}
