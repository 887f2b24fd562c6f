package payment_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// Stripe answers 409 while another request with the same key is still running: the
// earlier attempt whose answer the relay lost (or a relay's that died mid-send), which
// may yet act. Each 409 leaves the key's outcome as unknown as that attempt left it, so
// it is ambiguous too. The row's ambiguous mark tells of its latest attempt only
// (connectors.Delivery.PreviousAmbiguous), so when 409s ran to the attempts limit the row
// went dead unmarked, as if Stripe had certainly not acted: an operator reading it would
// take a replay with a new key for safe.
func TestDeliver_ConflictIsAmbiguous(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "order-12:charge"
	conflict := action{Status: http.StatusConflict, Body: `{"error":{"type":"idempotency_error","message":"There is currently another in-progress request using this Idempotent Key."}}`}
	b.f.Plan(key, action{DropBeforeEffect: true}, conflict, conflict)

	_, err := b.c.Deliver(t.Context(), delivery(key, createPI))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)

	for attempt := 2; attempt <= 3; attempt++ {
		d := delivery(key, createPI)
		d.Attempt, d.PreviousAmbiguous = attempt, attempt == 2
		raw, err := b.c.Deliver(t.Context(), d)
		require.Nil(t, raw)
		require.False(t, connectors.IsPermanent(err), "%v", err)
		require.True(t, connectors.IsAmbiguous(err), "attempt %d: a 409 leaves the key's outcome unknown: %v", attempt, err)
		require.Contains(t, err.Error(), "409 Conflict")
		require.Contains(t, err.Error(), "still running at Stripe")
	}
}

// A 409 whose body is lost on the way is retried as any 4xx cut short is, and is
// ambiguous as a whole 409 is: the status line is Stripe's, and a 409 says an earlier
// request with the key is still running and may act. It was retried unmarked, so a row
// whose last attempt met it ended dead as if Stripe had not acted.
func TestDeliver_ConflictCutShortIsAmbiguous(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "order-13:charge"
	b.f.Plan(key, action{Status: http.StatusConflict, CutBody: true,
		Body: `{"error":{"type":"idempotency_error","message":"There is currently another in-progress request using this Idempotent Key."}}`})

	raw, err := b.c.Deliver(t.Context(), delivery(key, createPI))
	require.Nil(t, raw)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.True(t, connectors.IsAmbiguous(err), "a 409 leaves the key's outcome unknown, its body or not: %v", err)
	require.Contains(t, err.Error(), "409 Conflict")
}
