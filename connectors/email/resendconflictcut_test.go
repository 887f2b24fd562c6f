package email_test

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

// Resend answers 409 only about the idempotency key: concurrent_idempotent_requests (an
// earlier request with the key is still in progress and may send the email) or
// invalid_idempotent_request (an earlier request with the key sent an email). Both are
// ambiguous. When the 409's body is lost on the way (the connection drops after the
// status line), the status line alone says as much: the attempt is still ambiguous,
// as the payment connector treats a 409 cut short. It was retried unmarked, so a row
// whose last attempt met it went dead as if Resend had sent nothing.
func TestResendDeliver_ConflictCutShortIsAmbiguous(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close() //nolint:errcheck
		// The status line and headers, then part of the body, then the connection drops.
		_, _ = buf.WriteString("HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n" +
			`{"statusCode":409,"name":"concurr`)
		_ = buf.Flush()
		_ = bufio.NewWriter(conn).Flush()
	}))
	t.Cleanup(srv.Close)
	c, err := email.NewResend(email.ResendConfig{APIKey: "re_test_key", APIBase: srv.URL, From: testFrom})
	require.NoError(t, err)

	d := delivery("order-14:receipt", `{"to":"a@example.com","subject":"s","text":"t"}`)
	d.Attempt = 2
	raw, err := c.Deliver(t.Context(), d)
	require.Error(t, err)
	require.Contains(t, err.Error(), "409 Conflict")
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.True(t, connectors.IsAmbiguous(err), "a 409 from Resend is about an earlier request with the key, which may have sent the email, its body read or not: %v", err)
	require.Equal(t, http.StatusConflict, decodeResendResult(t, raw).Status)
}
