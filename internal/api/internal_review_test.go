package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A 500 for a create said only "internal error", which a client reads as a request that
// did nothing: one that gives up on the key then acts again under a new one. A create (or
// a decision) may have committed before what failed; the answer says that sending the
// same request again, with its key, is safe and tells. Here the database refuses the
// insert with an error of no known class, from a trigger.
func TestInternalErrorOfACreateSaysAskAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	_, err := b.pool.Exec(t.Context(), `
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'refused by a trigger';
END $$;
CREATE TRIGGER refuse BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()`)
	require.NoError(t, err)
	r := b.do(t, "POST", "/v1/intents", agentSecret, "k-1", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, http.StatusInternalServerError, r.status, r.raw)
	require.Equal(t, "internal", r.errCode(t))
	require.Contains(t, r.raw, "same Idempotency-Key")
	require.NotContains(t, r.raw, "refused by a trigger", "the details stay in the log")

	r = b.do(t, "GET", "/v1/intents", agentSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
}
