package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// jsonb takes a payload nested deeper than encoding/json writes (10,000 levels), and
// plain SQL can write one. The answer was written as it was encoded, after its status:
// GET of such a row answered 200 with an empty body, which a client takes for success.
// It is an internal error, logged, with a JSON error body.
func TestAnswerThatDoesNotEncodeIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('deep', 'webhook', $1::jsonb)`,
		strings.Repeat("[", 10001)+strings.Repeat("]", 10001))
	require.NoError(t, err)

	r := b.do(t, "GET", "/v1/intents/deep", agentSecret, "", "")
	require.Equal(t, http.StatusInternalServerError, r.status, r.raw)
	require.Equal(t, "internal", r.errCode(t))
	require.Contains(t, b.logs.String(), "exceeded max depth")
}
