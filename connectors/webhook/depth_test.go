package webhook_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
)

// jsonb takes a payload nested deeper than Go's JSON reader does (10,000 levels), and
// plain SQL can write one. The connector refuses to send it, and said "the payload is
// not valid JSON" of what PostgreSQL holds as valid JSON; the reason now says what it is.
func TestDeliver_PayloadTooDeepSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{}, webhook.Config{})
	d := delivery("deep")
	d.Payload = []byte(strings.Repeat("[", 10001) + strings.Repeat("]", 10001))
	_, err := b.c.Deliver(t.Context(), d)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.NotContains(t, err.Error(), "not valid JSON")
	require.Contains(t, err.Error(), "exceeded max depth")
	require.Equal(t, 0, b.r.Effects("deep"))
}
