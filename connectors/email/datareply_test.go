package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// The reply to the end of the message decides whether the server took it, by its first
// digit (RFC 5321 section 4.2.1): 2yz is a positive completion. go-mail waits for 250
// exactly and reports any other code as a *textproto.Error, which the connector took for
// a 4xx refusal and retried: a message the server had taken went out again on the retry,
// and SMTP servers do not dedupe.
func TestDeliver_PositiveReplyOtherThan250IsAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})
	const key = "order-8:receipt"
	d := delivery(key, `{"to":"a@example.com","text":"x","headers":{"X-Test-Data-Reply":"251"}}`)

	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err, "the server answered 251 to the message: it took it (retryable: %t, ambiguous: %t)",
		!connectors.IsPermanent(err), connectors.IsAmbiguous(err))
	res := decodeResult(t, raw)
	require.Equal(t, wantMessageID(key, "shop.example"), res.MessageID)
	require.Contains(t, res.ServerReply, "251")
	require.Equal(t, 1, b.srv.Effects(key))
}

// A reply to the end of the message that is neither a completion nor a refusal (1yz,
// 3yz, or out of range) leaves unknown whether the server queued the message: not a
// refusal to retry plainly, but an ambiguous attempt.
func TestDeliver_UnexpectedReplyAfterTheMessageIsAmbiguous(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})
	_, err := b.c.Deliver(t.Context(), delivery("order-9:receipt", `{"to":"a@example.com","text":"x","headers":{"X-Test-Data-Reply":"354"}}`))
	require.Error(t, err)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.False(t, connectors.IsPermanent(err), "%v", err)
}
