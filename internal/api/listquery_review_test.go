package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A listing's query is read as strictly as a create's body: a parameter that does not
// parse (a ';' separator, a bad %-escape), that is unknown (a typo) or that comes twice
// with different values answers 400. Each was dropped, and the listing went on without
// that filter: ?status=dead;pending or ?state=dead listed every intent, and
// ?connector=webhook:a&connector=webhook:b only webhook:a's.
func TestListQueryItCannotReadIsBadRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "POST", "/v1/intents", adminSecret, "k1", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	for _, q := range []string{
		"status=dead;pending", "status=dea%zz", "state=dead", "Status=dead", "limit=1&limit=2",
		"connector=webhook:a&connector=webhook:b", "after=x&after=y",
	} {
		r := b.do(t, "GET", "/v1/intents?"+q, adminSecret, "", "")
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", q, r.raw)
		require.Equal(t, "invalid_filter", r.errCode(t), q)
	}
	// What the README shows still works: status repeated or comma-separated, empty
	// parameters, the same value twice.
	for _, q := range []string{"status=pending&status=dead", "status=pending,dead", "status=&connector=&limit=&after=",
		"connector=webhook&connector=webhook", ""} {
		r := b.do(t, "GET", "/v1/intents?"+q, adminSecret, "", "")
		require.Equal(t, http.StatusOK, r.status, "%s: %s", q, r.raw)
		require.Len(t, r.body["intents"], 1, q)
	}
}
