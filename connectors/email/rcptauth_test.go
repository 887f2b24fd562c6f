package email_test

import (
	"errors"
	"net/textproto"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// A server that wants a login the instance lacks may say so at RCPT rather than at MAIL
// FROM: "530 5.7.0 Authentication required" (RFC 4954 has any command but a few answer
// it so). That is the configuration's fault, not the row's, as the same reply to MAIL
// FROM is; a permanent refusal sent every row to dead while the configuration was wrong.
func TestRcptRefusedForWantOfLoginIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{Username: "relay", Password: "pw", AuthAtRcpt: true}, email.Config{})
	d := delivery("auth-missing-at-rcpt:1", `{"to":"a@example.com","text":"x"}`)
	_, err := b.c.Deliver(t.Context(), d)
	require.Error(t, err)
	require.Equal(t, 0, b.srv.Effects(d.Key))
	te, ok := errors.AsType[*textproto.Error](err)
	require.True(t, ok, "%v", err)
	require.Equal(t, 530, te.Code)
	require.Contains(t, err.Error(), "RCPT TO")
	require.False(t, connectors.IsPermanent(err), "a configuration problem must not kill rows: %v", err)
	require.False(t, connectors.IsAmbiguous(err), "nothing was sent: %v", err)

	// With a recipient the server refuses for itself as well, the row is at fault.
	b = setup(t, serverOptions{}, email.Config{})
	_, err = b.c.Deliver(t.Context(), delivery("auth-fine:1", `{"to":["a@example.com","rcpt550@example.com"],"text":"x"}`))
	require.True(t, connectors.IsPermanent(err), "%v", err)
}
