package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// the approval gate shows an admin the payload's "params", which validation
// checked; the payment connector decodes the payload into a struct, where Go's
// encoding/json matches field names case-insensitively with Unicode folding ("paramſ",
// with U+017F LATIN SMALL LETTER LONG S, folds to "PARAMS") and the last matching key
// wins. jsonb sorts keys by length first, so "paramſ" (7 bytes) comes after "params"
// (6 bytes): the charge the relay sends is the one the admin did not look at.
func TestApprovedParamsAreTheParamsSent(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)

	var (
		mu    sync.Mutex
		forms []url.Values
	)
	stripe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		mu.Lock()
		forms = append(forms, r.PostForm)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"pi_1","object":"payment_intent","status":"requires_payment_method","amount":`+r.PostForm.Get("amount")+`,"currency":"eur"}`)
	}))
	t.Cleanup(stripe.Close)

	svc := &intent.Service{Pool: pool, Policy: &intent.Policy{
		Tokens: []intent.Token{
			{Name: "agent", SHA256: hash(agentSecret), Connectors: []string{"payment"}},
			{Name: "admin", SHA256: hash(adminSecret), Connectors: []string{"*"}, Admin: true},
		},
		ApprovalRequired: []string{"payment"},
	}}
	b := serveAPI(t, pool, svc, nil)

	pay, err := payment.New(payment.Config{APIKey: "sk_test_123", APIBase: stripe.URL, Timeout: 10 * time.Second})
	require.NoError(t, err)
	r, err := relay.New(pool, &relay.Config{PollInterval: 50 * time.Millisecond, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		map[string]relay.Instance{"payment": {Connector: pay}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	res := b.do(t, "POST", "/v1/intents", agentSecret, "charge-1",
		`{"connector":"payment","payload":{"operation":"payment_intent.create",`+
			`"params":{"amount":100,"currency":"eur"},"param\u017f":{"amount":99999900,"currency":"eur"}}}`)
	if res.status == http.StatusUnprocessableEntity {
		require.Equal(t, "invalid_intent", res.errCode(t)) // refused up front: nothing to approve
		return
	}
	require.Equal(t, http.StatusCreated, res.status, res.raw)
	require.Equal(t, outbox.StatusAwaitingApproval, res.body["status"])

	// The admin reads the intent: params say 100, and approves that.
	res = b.do(t, "GET", "/v1/intents/charge-1", adminSecret, "", "")
	require.Equal(t, http.StatusOK, res.status, res.raw)
	params := res.body["payload"].(map[string]any)["params"].(map[string]any)
	require.EqualValues(t, 100, params["amount"])
	res = b.do(t, "POST", "/v1/intents/charge-1/approve", adminSecret, "", `{"reason":"100 cents is fine"}`)
	require.Equal(t, http.StatusOK, res.status, res.raw)

	require.Eventually(t, func() bool {
		in, err := outbox.Get(t.Context(), pool, "charge-1")
		return err == nil && (in.Status == outbox.StatusDelivered || in.Status == outbox.StatusDead)
	}, time.Minute, 10*time.Millisecond)
	in, err := outbox.Get(t.Context(), pool, "charge-1")
	require.NoError(t, err)
	t.Logf("status %s, result %s, last error %q", in.Status, in.Result, in.LastError)
	mu.Lock()
	defer mu.Unlock()
	for _, f := range forms {
		require.Equal(t, "100", f.Get("amount"), "the approved intent's params said amount 100; Stripe was sent %v", f)
	}
}

// a key in the path that is not valid UTF-8 (or holds NUL) cannot name an intent
// (the POST refuses such keys with 400), so asking for it is "not found" or a 400, not
// a 500 from PostgreSQL refusing the parameter.
func TestGetBadKeyIsNotInternalError(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, path := range []string{"/v1/intents/%FF", "/v1/intents/a%00b"} {
		r := b.do(t, "GET", path, agentSecret, "", "")
		require.Contains(t, []int{http.StatusNotFound, http.StatusBadRequest}, r.status, "%s: %s", path, r.raw)
		r = b.do(t, "POST", path+"/cancel", adminSecret, "", "")
		require.Contains(t, []int{http.StatusNotFound, http.StatusBadRequest}, r.status, "%s/cancel: %s", path, r.raw)
	}
}

// the table lets plain SQL write a header that is not a string (the constraint asks
// only for an object, and the relay passes such a value on as its JSON text). Reading the
// row back fails instead: outbox.Get, the re-enqueue of the same request, GET of the key
// and every listing page that holds the row answer an error, so "ask again" cannot
// return the stored outcome.
func TestRowWithNonStringHeaderCanBeRead(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := t.Context()
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload, headers, status, result)
		VALUES ('sql-1', 'webhook', '{"order": 1}', '{"x-retry-budget": 3}', 'delivered', '{"status": 200}')`)
	require.NoError(t, err)

	_, err = outbox.Get(ctx, b.pool, "sql-1")
	require.NoError(t, err, "outbox.Get")
	in, err := outbox.Enqueue(ctx, b.pool, outbox.Message{Key: "sql-1", Connector: "webhook", Payload: map[string]int{"order": 1}})
	require.NoError(t, err, "the same request again")
	require.False(t, in.Inserted)

	r := b.do(t, "GET", "/v1/intents/sql-1", agentSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	r = b.do(t, "GET", "/v1/intents", agentSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
}
