package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// A server that requires authentication, and a connector configured without a username
// (a configuration problem, not the row's): the server refuses MAIL FROM with
// "530 5.7.0 Authentication required". The package documentation says authentication
// problems are retried even on a 5xx ("the fault lies with the server or the
// configuration, not the row, and marking it permanent would send every row to dead
// while it lasts"); this one was classified permanent, and every row went to dead.
func TestMailFromRefusedForWantOfLoginIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{Username: "relay", Password: "pw"}, email.Config{})
	d := delivery("auth-missing:1", `{"to":"a@example.com","text":"x"}`)
	_, err := b.c.Deliver(t.Context(), d)
	require.Error(t, err)
	t.Logf("error: %v", err)
	require.Equal(t, 0, b.srv.Effects(d.Key))
	require.False(t, connectors.IsPermanent(err), "a configuration problem must not kill rows: %v", err)
}
