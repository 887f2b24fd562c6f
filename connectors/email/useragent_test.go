package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/email"
)

// A payload's X-Mailer or User-Agent header is not one the package refuses, so it is
// sent: the connector's own "outboxd" must not replace it silently.
func TestDeliver_PayloadUserAgentIsKept(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})

	_, err := b.c.Deliver(t.Context(), delivery("ua:1", `{"to":"a@example.com","text":"x","headers":{"X-Mailer":"shop mailer 2"}}`))
	require.NoError(t, err)
	_, err = b.c.Deliver(t.Context(), delivery("ua:2", `{"to":"a@example.com","text":"x"}`))
	require.NoError(t, err)

	msgs := b.srv.Messages()
	require.Len(t, msgs, 2)
	require.Equal(t, "shop mailer 2", msgs[0].Header.Get("X-Mailer"), "the payload's header is sent as given")
	require.Equal(t, "outboxd", msgs[1].Header.Get("X-Mailer"), "without one, the connector names itself")
	require.Equal(t, "outboxd", msgs[1].Header.Get("User-Agent"))
}
