package email_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// A server's 5xx refusal is its answer even when the attempt's context ends after it
// came (here, a relay stopping while the connector abandons the refused transaction).
// The relay takes an error that wraps ctx's error as the stop's doing, and turns a
// permanent one into an ambiguous attempt: a recipient the server refused, nothing
// sent, was recorded as "the receiver may have acted" and, with
// OUTBOX_EMAIL_ON_AMBIGUOUS=hold, held for an operator.
func TestDeliver_RefusalBeforeTheStopIsTheServersAnswer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	b := setup(t, serverOptions{OnReset: cancel}, email.Config{})
	const key = "refused-then-stopped:1"
	_, err := b.c.Deliver(ctx, delivery(key, `{"to":["ok@example.com","rcpt550@example.com"],"text":"x"}`))
	require.Error(t, err)
	require.Error(t, ctx.Err(), "the stop came during the attempt")
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.False(t, connectors.IsAmbiguous(err), "%v", err)
	require.NotErrorIs(t, err, context.Canceled, "the refusal came before the stop, so it is not the stop's doing: %v", err)
	require.Equal(t, 0, b.srv.Effects(key))
}
