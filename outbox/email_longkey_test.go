package outbox_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A valid key (200 characters, 400 bytes, within MaxKeyLength) for an email row is
// accepted at enqueue: only the Resend transport limits keys (256 bytes), and enqueue
// cannot tell which transport delivers; the SMTP transport takes it.
func TestEnqueueEmailKeyOver256BytesAccepted(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	key := strings.Repeat("é", 200)
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(t.Context(), tx, outbox.Message{Key: key, Connector: "email",
			Payload: []byte(`{"to":"ann@example.com","subject":"s","text":"t"}`)})
		return err
	})
	require.NoError(t, err)
}
