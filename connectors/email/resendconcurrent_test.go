package email_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// Resend answers 409 concurrent_idempotent_requests while another request with the same
// key is still in progress: an earlier attempt whose answer the relay lost (or a relay's
// that died mid-send), which may yet send the email. Each such 409 leaves the key's
// outcome as unknown as that attempt left it, so it is ambiguous too. The row's
// ambiguous mark tells of its latest attempt only (connectors.Delivery.PreviousAmbiguous),
// so a row whose attempts ran out on these 409s went dead unmarked, as if Resend had
// certainly not sent anything: an operator would take a replay with a new key for safe.
func TestResendDeliver_ConcurrentRequestIsAmbiguous(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	const key, payload = "order-12:receipt", `{"to":"a@example.com","subject":"s","text":"t"}`
	for range 2 {
		f.Script(key, http.StatusConflict, nil,
			`{"statusCode":409,"name":"concurrent_idempotent_requests","message":"Same idempotency key used while original request is still in progress. Try the request again later."}`)
	}

	for attempt := 2; attempt <= 3; attempt++ {
		d := delivery(key, payload)
		d.Attempt, d.PreviousAmbiguous = attempt, attempt == 2
		_, err := c.Deliver(t.Context(), d)
		require.Error(t, err)
		require.False(t, connectors.IsPermanent(err), "%v", err)
		require.True(t, connectors.IsAmbiguous(err), "attempt %d: a request with the key is still in progress and may send: %v", attempt, err)
		require.Contains(t, err.Error(), "concurrent_idempotent_requests")
	}
}
