package receiver

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestVerifySignature_SpecVector checks the verifier against the example published with
// the Standard Webhooks specification and its reference libraries.
func TestVerifySignature_SpecVector(t *testing.T) {
	t.Parallel()
	r, err := Start(Options{Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	require.NoError(t, err)
	r.Close()
	secret := r.secrets

	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	body := []byte(`{"test": 2432232314}`)
	at := time.Unix(1614265330, 0)

	require.NoError(t, verifySignature(secret, h, body, at))
	require.Error(t, verifySignature(secret, h, []byte(`{"test": 2432232315}`), at))
	require.ErrorContains(t, verifySignature(secret, h, body, at.Add(10*time.Minute)), "webhook-timestamp")
}
