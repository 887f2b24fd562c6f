package email_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// An answer of 101 Switching Protocols hands its connection over as its body, which the
// attempt's timeout no longer bounds (net/http gives it to the caller). Deliver read it
// for Resend's error, and so waited for the server to hang up, past its timeout and its
// row's lease; the webhook connector had been fixed for this, Resend had not. It is
// now a permanent answer, classified by its status.
func TestResendDeliver_SwitchingProtocols(t *testing.T) {
	t.Parallel()
	hangUp := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n")
		_ = rw.Flush()
		<-hangUp // the connection stays open, as a server that switched would keep it
	}))
	t.Cleanup(srv.Close)
	// Generous for a busy machine, and still well short of the watchdog below, which a
	// Deliver that reads the handed-over connection reaches whatever the timeout.
	c, err := email.NewResend(email.ResendConfig{APIKey: "re_x", APIBase: srv.URL, From: testFrom, Timeout: 10 * time.Second})
	require.NoError(t, err)

	type answer struct {
		res email.ResendResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		raw, err := c.Deliver(t.Context(), delivery("k", `{"to":"a@example.com","subject":"s","text":"t"}`))
		var res email.ResendResult
		if raw != nil {
			res = decodeResendResult(t, raw)
		}
		done <- answer{res, err}
	}()
	var got answer
	select {
	case got = <-done:
		close(hangUp)
	case <-time.After(time.Minute): // a watchdog, not a timing check: without the fix it never returns
		close(hangUp)
		t.Fatal("Deliver still reads the connection a 101 answer handed over")
	}
	require.True(t, connectors.IsPermanent(got.err), "%v", got.err)
	require.Contains(t, got.err.Error(), "Resend answered 101 Switching Protocols")
	require.Equal(t, http.StatusSwitchingProtocols, got.res.Status)
}
