package email_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// An attempt that runs past its timeout says so: errors.Is finds ErrTimeout, as its doc
// promises. go-mail's deadline on the connection is set to the same timeout just after
// the dial, so against a server on loopback it strikes within microseconds of the
// attempt's own, often first, and the error said only "i/o timeout". Each attempt here
// waits for a reply to the message that never comes; a few are made, as which deadline
// fires first is up to the scheduler.
func TestDeliver_TimeoutAfterTheMessageNamesItself(t *testing.T) {
	t.Parallel()
	addr, _ := scriptedServer(t, "") // never replies to the message
	c, err := email.New(email.Config{Addr: addr, From: testFrom, Timeout: 200 * time.Millisecond})
	require.NoError(t, err)
	for range 10 {
		_, err := c.Deliver(t.Context(), delivery("silent-after-data:1", `{"to":"a@example.com","text":"x"}`))
		require.ErrorIs(t, err, email.ErrTimeout)
		require.True(t, connectors.IsAmbiguous(err), "the server may have queued it: %v", err)
		require.False(t, connectors.IsPermanent(err), "%v", err)
	}
}
