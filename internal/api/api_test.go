package api_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/api"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Test tokens: agent may use webhook instances and payment; crm only webhook:crm;
// admin everything.
const (
	agentSecret  = "obx_agent-secret-value"
	crmSecret    = "obx_crm-secret-value"
	adminSecret  = "obx_admin-secret-value"
	admin2Secret = "obx_admin2-secret-value"
)

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

const paymentPayload = `{"operation":"payment_intent.create","params":{"amount":100,"currency":"eur"}}`

type testBundle struct {
	pool *pgxpool.Pool
	url  string
	logs *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type options struct {
	rate    float64
	maxBody int64
}

func setup(t *testing.T, o options) *testBundle {
	t.Helper()
	pool := pgtest.DB(t)
	logs := &syncBuffer{}
	svc := &intent.Service{Pool: pool, Policy: &intent.Policy{
		Tokens: []intent.Token{
			{Name: "agent", SHA256: hash(agentSecret), Connectors: []string{"webhook:*", "payment"}},
			{Name: "crm", SHA256: hash(crmSecret), Connectors: []string{"webhook:crm"}},
			{Name: "admin", SHA256: hash(adminSecret), Connectors: []string{"*"}, Admin: true},
			{Name: "admin2", SHA256: hash(admin2Secret), Connectors: []string{"*"}, Admin: true},
		},
		ApprovalRequired: []string{"payment"},
	}}
	h := api.New(svc, &api.Config{
		Rate:    o.rate,
		MaxBody: o.maxBody,
		Logger:  slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	mux := http.NewServeMux()
	mux.Handle("/v1/", h)
	// Another handler of the same tokens under the API's limits, as serve mounts /mcp.
	mux.Handle("/other", h.Limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_, _ = io.WriteString(w, `{"error":{"code":"too_large","message":"`+err.Error()+`"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"ok":true}`)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &testBundle{pool: pool, url: srv.URL, logs: logs}
}

type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (b *testBundle) do(t *testing.T, method, path, token, key, body string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, b.url+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	r := response{status: res.StatusCode, header: res.Header, raw: string(raw)}
	require.Equal(t, "application/json", res.Header.Get("Content-Type"), "body: %s", raw)
	require.NoError(t, json.Unmarshal(raw, &r.body), "body: %s", raw)
	return r
}

// errCode returns the error code of an error response.
func (r response) errCode(t *testing.T) string {
	t.Helper()
	e, ok := r.body["error"].(map[string]any)
	require.True(t, ok, "not an error response: %s", r.raw)
	require.NotEmpty(t, e["message"])
	return e["code"].(string)
}

func (b *testBundle) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n))
	return n
}

func TestCreate(t *testing.T) {
	t.Parallel()

	t.Run("new, replayed, conflicting", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{})
		body := `{"connector":"webhook","payload":{"order":1}}`
		r := b.do(t, "POST", "/v1/intents", agentSecret, "order-1", body)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
		require.Equal(t, "order-1", r.body["key"])
		require.Equal(t, "pending", r.body["status"])
		require.Equal(t, "agent", r.body["created_by"])
		require.Empty(t, r.header.Get("Idempotent-Replayed"))

		// The same decision again, with the payload's keys in another order.
		r = b.do(t, "POST", "/v1/intents", agentSecret, "order-1", `{"payload":{"order":1},"connector":"webhook"}`)
		require.Equal(t, http.StatusOK, r.status, r.raw)
		require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
		require.Equal(t, "order-1", r.body["key"])
		require.Equal(t, 1, b.count(t))

		r = b.do(t, "POST", "/v1/intents", agentSecret, "order-1", `{"connector":"webhook","payload":{"order":2}}`)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, r.raw)
		require.Equal(t, "key_conflict", r.errCode(t))
		require.Contains(t, r.raw, `order-1`)
		require.Equal(t, 1, b.count(t))
	})

	t.Run("concurrent creates with one key make one row", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{})
		var wg sync.WaitGroup
		ids := make([]any, 8)
		statuses := make([]int, 8)
		for i := range ids {
			wg.Go(func() {
				r := b.do(t, "POST", "/v1/intents", adminSecret, "same", `{"connector":"webhook","payload":{"a":1}}`)
				ids[i], statuses[i] = r.body["id"], r.status
			})
		}
		wg.Wait()
		created := 0
		for i := range ids {
			require.Equal(t, ids[0], ids[i])
			if statuses[i] == http.StatusCreated {
				created++
			} else {
				require.Equal(t, http.StatusOK, statuses[i])
			}
		}
		require.Equal(t, 1, created)
		require.Equal(t, 1, b.count(t))
	})

	t.Run("bad input is a 4xx and writes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{maxBody: 256})
		ok := `{"connector":"webhook","payload":{"a":1}}`
		for _, tc := range []struct {
			name, token, key, body string
			status                 int
			code                   string
		}{
			{"no token", "", "k", ok, 401, "unauthorized"},
			{"bad token", "obx_nope", "k", ok, 401, "unauthorized"},
			{"no key", agentSecret, "", ok, 400, "bad_request"},
			{"key too long", agentSecret, strings.Repeat("k", 256), ok, 400, "bad_request"},
			{"not JSON", agentSecret, "k", `{"connector":`, 400, "bad_request"},
			{"unknown field", agentSecret, "k", `{"connector":"webhook","payload":{},"extra":1}`, 400, "bad_request"},
			{"trailing data", agentSecret, "k", ok + ` {}`, 400, "bad_request"},
			{"over the body limit", agentSecret, "k", `{"connector":"webhook","payload":{"a":"` + strings.Repeat("x", 300) + `"}}`, 413, "body_too_large"},
			{"connector not allowed", crmSecret, "k", ok, 403, "forbidden"},
			{"unknown connector kind", adminSecret, "k", `{"connector":"fax","payload":{}}`, 422, "invalid_intent"},
			{"invalid payload for kind", agentSecret, "k", `{"connector":"payment","payload":{"operation":"nope"}}`, 422, "invalid_intent"},
			{"no payload", agentSecret, "k", `{"connector":"webhook"}`, 422, "invalid_intent"},
		} {
			r := b.do(t, "POST", "/v1/intents", tc.token, tc.key, tc.body)
			require.Equal(t, tc.status, r.status, "%s: %s", tc.name, r.raw)
			require.Equal(t, tc.code, r.errCode(t), tc.name)
			if tc.status == 401 {
				require.NotEmpty(t, r.header.Get("WWW-Authenticate"))
			}
		}
		require.Equal(t, 0, b.count(t))
		r := b.do(t, "POST", "/v1/intents", agentSecret, strings.Repeat("k", 255), ok)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
	})
}

func TestScope(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for key, conn := range map[string]string{"w1": "webhook", "c1": "webhook:crm", "b1": "webhook:billing"} {
		r := b.do(t, "POST", "/v1/intents", adminSecret, key, `{"connector":"`+conn+`","payload":{"k":"`+key+`"}}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
	}

	// crm sees only webhook:crm.
	r := b.do(t, "GET", "/v1/intents/c1", crmSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "admin", r.body["created_by"])
	r = b.do(t, "GET", "/v1/intents/w1", crmSecret, "", "")
	require.Equal(t, http.StatusNotFound, r.status, r.raw)
	require.Equal(t, "not_found", r.errCode(t))
	r = b.do(t, "GET", "/v1/intents/missing", crmSecret, "", "")
	require.Equal(t, http.StatusNotFound, r.status, r.raw)

	keys := func(r response) []string {
		var out []string
		for _, in := range r.body["intents"].([]any) {
			out = append(out, in.(map[string]any)["key"].(string))
		}
		return out
	}
	r = b.do(t, "GET", "/v1/intents", crmSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, []string{"c1"}, keys(r))
	r = b.do(t, "GET", "/v1/intents?connector=webhook", crmSecret, "", "")
	require.Equal(t, http.StatusForbidden, r.status, r.raw)

	// agent has webhook:*, which includes the plain webhook instance.
	r = b.do(t, "GET", "/v1/intents?status=pending&limit=2", agentSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Len(t, keys(r), 2)
	next := r.body["next"].(string)
	r = b.do(t, "GET", "/v1/intents?limit=2&after="+next, agentSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Len(t, keys(r), 1)
	r = b.do(t, "GET", "/v1/intents?status=bogus", agentSecret, "", "")
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
	r = b.do(t, "GET", "/v1/intents?limit=x", agentSecret, "", "")
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)

	// Only admins decide.
	for _, action := range []string{"approve", "reject", "cancel"} {
		r = b.do(t, "POST", "/v1/intents/w1/"+action, agentSecret, "", "")
		require.Equal(t, http.StatusForbidden, r.status, r.raw)
		require.Equal(t, "forbidden", r.errCode(t))
	}
	r = b.do(t, "POST", "/v1/intents/w1/cancel", adminSecret, "", `{"reason":"not needed"}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "canceled", r.body["status"])
	r = b.do(t, "POST", "/v1/intents/w1/cancel", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	r = b.do(t, "POST", "/v1/intents/missing/cancel", adminSecret, "", "")
	require.Equal(t, http.StatusNotFound, r.status, r.raw)
	r = b.do(t, "POST", "/v1/intents/c1/cancel", adminSecret, "", `{"why":"x"}`)
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
}

// An approval gate is a second pair of eyes: the token that proposed an intent awaiting
// approval cannot approve it, even an admin token (one given to an agent would approve
// its own payments); another admin token can, and the proposer may still reject it.
func TestAProposerCannotApproveItsOwnIntent(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, key := range []string{"own-1", "own-2"} {
		r := b.do(t, "POST", "/v1/intents", adminSecret, key, `{"connector":"payment","payload":`+paymentPayload+`}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
		require.Equal(t, "awaiting_approval", r.body["status"])
	}

	r := b.do(t, "POST", "/v1/intents/own-1/approve", adminSecret, "", "")
	require.Equal(t, http.StatusForbidden, r.status, r.raw)
	require.Equal(t, "forbidden", r.errCode(t))
	require.Contains(t, r.raw, `token \"admin\" proposed intent \"own-1\"`)
	require.Contains(t, r.raw, "outboxd approve")
	r = b.do(t, "GET", "/v1/intents/own-1", adminSecret, "", "")
	require.Equal(t, "awaiting_approval", r.body["status"], "nothing was approved")

	r = b.do(t, "POST", "/v1/intents/own-1/approve", admin2Secret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "pending", r.body["status"])
	r = b.do(t, "POST", "/v1/intents/own-1/approve", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, "approving an approved intent again is harmless, whoever asks: %s", r.raw)

	r = b.do(t, "POST", "/v1/intents/own-2/reject", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "canceled", r.body["status"])
}

func TestApprovalFlow(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	create := func(key string) {
		t.Helper()
		r := b.do(t, "POST", "/v1/intents", agentSecret, key, `{"connector":"payment","payload":`+paymentPayload+`}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
		require.Equal(t, "awaiting_approval", r.body["status"])
	}
	create("pay-1")
	create("pay-2")

	r := b.do(t, "POST", "/v1/intents/pay-1/approve", agentSecret, "", "")
	require.Equal(t, http.StatusForbidden, r.status, r.raw)
	r = b.do(t, "POST", "/v1/intents/pay-1/approve", adminSecret, "", `{"reason":"looks right"}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "pending", r.body["status"])
	r = b.do(t, "POST", "/v1/intents/pay-1/approve", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "pending", r.body["status"])
	r = b.do(t, "POST", "/v1/intents/pay-1/reject", adminSecret, "", "")
	require.Equal(t, http.StatusConflict, r.status, r.raw)

	r = b.do(t, "POST", "/v1/intents/pay-2/reject", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "canceled", r.body["status"])
	r = b.do(t, "POST", "/v1/intents/pay-2/reject", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	r = b.do(t, "POST", "/v1/intents/pay-2/approve", adminSecret, "", "")
	require.Equal(t, http.StatusConflict, r.status, r.raw)
	require.Equal(t, "conflict_state", r.errCode(t))

	var audits int
	require.NoError(t, b.pool.QueryRow(t.Context(),
		`SELECT count(*) FROM outbox_audit WHERE action IN ('approve', 'reject') AND actor = 'token:admin'`).Scan(&audits))
	require.Equal(t, 2, audits)

	// A replayed create of an approved intent returns it as it is now.
	r = b.do(t, "POST", "/v1/intents", agentSecret, "pay-1", `{"connector":"payment","payload":`+paymentPayload+`}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "pending", r.body["status"])

	// webhook needs no approval.
	r = b.do(t, "POST", "/v1/intents", agentSecret, "hook-1", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	require.Equal(t, outbox.StatusPending, r.body["status"])
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, options{rate: 1})
	// A rate of 1/s allows a burst of 1; the next request comes well within the second
	// only if it is immediate, so no assertion depends on timing: go on until refused.
	var r response
	for range 50 {
		r = b.do(t, "GET", "/v1/intents", agentSecret, "", "")
		if r.status == http.StatusTooManyRequests {
			break
		}
	}
	require.Equal(t, http.StatusTooManyRequests, r.status, r.raw)
	require.Equal(t, "rate_limited", r.errCode(t))
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.NotEqual(t, "0", r.header.Get("Retry-After"))
}

// The MCP endpoint's requests are under the API's per-token rate limit (each token's
// budget is shared between the two) and its body limit.
func TestLimitAppliesToAnotherHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, options{rate: 1, maxBody: 16})
	var r response
	for range 50 { // as in TestRateLimit: go on until refused
		r = b.do(t, "GET", "/other", agentSecret, "", "")
		if r.status == http.StatusTooManyRequests {
			break
		}
	}
	require.Equal(t, http.StatusTooManyRequests, r.status, r.raw)
	require.Equal(t, "rate_limited", r.errCode(t))

	b = setup(t, options{maxBody: 16})
	r = b.do(t, "POST", "/other", agentSecret, "", strings.Repeat("x", 100))
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status, r.raw)
	r = b.do(t, "POST", "/other", agentSecret, "", "{}")
	require.Equal(t, http.StatusOK, r.status, r.raw)
}

func TestTokensNeverLogged(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	b.do(t, "POST", "/v1/intents", agentSecret, "k1", `{"connector":"webhook","payload":{}}`)
	b.do(t, "GET", "/v1/intents/k1", agentSecret, "", "")
	b.do(t, "GET", "/v1/intents/k1", "obx_wrong-secret", "", "")
	b.do(t, "POST", "/v1/intents/k1/approve", adminSecret, "", "")
	logs := b.logs.String()
	require.Contains(t, logs, `"token":"agent"`)
	for _, s := range []string{agentSecret, adminSecret, "obx_wrong-secret", "Bearer"} {
		require.NotContains(t, logs, s)
	}
}

func TestReplayComparesNumbersByValue(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, tc := range []struct{ key, conn, first, again string }{
		{"n1", "webhook", `{"a":1.0,"b":[1e2]}`, `{"b":[100],"a":1}`},
		{"n2", "webhook", `{"a":1}`, `{"a":1.00}`},
		{"n3", "webhook", `{"a":12345678901234567890123}`, `{"a":12345678901234567890123.0}`},
		{"p1", "payment", paymentPayload, `{"operation":"payment_intent.create","params":{"amount":100.0,"currency":"eur"}}`},
	} {
		r := b.do(t, "POST", "/v1/intents", agentSecret, tc.key, `{"connector":"`+tc.conn+`","payload":`+tc.first+`}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
		r = b.do(t, "POST", "/v1/intents", agentSecret, tc.key, `{"connector":"`+tc.conn+`","payload":`+tc.again+`}`)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", tc.key, r.raw)
		require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
		// A different number is a conflict.
		r = b.do(t, "POST", "/v1/intents", agentSecret, tc.key, `{"connector":"`+tc.conn+`","payload":{"a":2}}`)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s: %s", tc.key, r.raw)
	}
	// Purged payload: replay is the same intent.
	r := b.do(t, "POST", "/v1/intents", agentSecret, "pp", `{"connector":"payment","payload":`+paymentPayload+`}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET payload='{}' WHERE idempotency_key='pp'`)
	require.NoError(t, err)
	r = b.do(t, "POST", "/v1/intents", agentSecret, "pp", `{"connector":"payment","payload":{"params":{"currency":"eur","amount":100.0},"operation":"payment_intent.create"}}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	r = b.do(t, "POST", "/v1/intents", agentSecret, "pp", `{"connector":"payment","payload":{}}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, r.raw)
	// key conflict for a key the token cannot see must not leak its connector
	r = b.do(t, "POST", "/v1/intents", crmSecret, "pp", `{"connector":"webhook:crm","payload":{}}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, r.raw)
	require.NotContains(t, r.raw, "payment")
}

// After `purge --payload-only`, a webhook intent's payload is {}; a request under its key
// with payload {} is a different request than the one the key named (the fingerprint
// says so), so it must be 422, not a 200 replay.
func TestPurgedPayloadEmptyRequestConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "POST", "/v1/intents", agentSecret, "pw", `{"connector":"webhook","payload":{"email":"a@example.com"}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET status='delivered', payload='{}' WHERE idempotency_key='pw'`)
	require.NoError(t, err)
	r = b.do(t, "POST", "/v1/intents", agentSecret, "pw", `{"connector":"webhook","payload":{"email":"a@example.com"}}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	r = b.do(t, "POST", "/v1/intents", agentSecret, "pw", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, r.raw)
	require.Empty(t, r.header.Get("Idempotent-Replayed"))
}

// serveAPI serves svc's intent API (under cfg, logs discarded when it names no logger)
// on a loopback test server; pool is the database the test reads rows from.
func serveAPI(t *testing.T, pool *pgxpool.Pool, svc *intent.Service, cfg *api.Config) *testBundle {
	t.Helper()
	if cfg == nil {
		cfg = &api.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", api.New(svc, cfg))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &testBundle{pool: pool, url: srv.URL}
}
