package email_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// Two payload headers that differ only in case name one mail header. Before the fix the
// connector kept whichever map iteration met last: a value silently dropped, and a
// different request body from one attempt of the same row to the next, which Resend
// refuses as a reused key (409 invalid_idempotent_request, permanent).
const caseClashPayload = `{"to":"a@example.com","subject":"s","text":"t","headers":{"x-tenant":"acme","X-Tenant":"globex"}}`

func TestResendDeliver_HeadersDifferingOnlyInCase(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	for i := range 20 {
		d := delivery(fmt.Sprintf("clash-%d", i), caseClashPayload)
		for attempt := 1; attempt <= 2; attempt++ {
			_, err := c.Deliver(t.Context(), d)
			require.Error(t, err, "row %d attempt %d: an ambiguous header must be refused, not sent", i, attempt)
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), "differ only in case")
		}
	}
	require.Empty(t, f.Requests())
}

func TestDeliver_HeadersDifferingOnlyInCase(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})
	_, err := b.c.Deliver(t.Context(), delivery("clash", caseClashPayload))
	require.Error(t, err, "an ambiguous header must be refused, not sent with one value dropped")
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Empty(t, b.srv.Messages())
}
