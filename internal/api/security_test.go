package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// A row's own Authorization header replaces the webhook instance's credentials (README,
// OUTBOX_WEBHOOK_URL): it is a credential for the receiver. A token that may read the
// connector's intents must not be handed it, or an agent could call the receiver
// itself, past the outbox and its approval gates. (The MCP tools leave headers out.)
func TestRowCredentialsNotReturned(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	const secret = "Bearer receiver-credential-s3cret"
	_, err := outbox.Enqueue(t.Context(), b.pool, outbox.Message{
		Key: "app-1", Connector: "webhook:crm", Payload: map[string]any{"n": 1},
		Headers: map[string]string{
			"authorization": secret,
			"traceparent":   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		},
	})
	require.NoError(t, err)

	r := b.do(t, "GET", "/v1/intents/app-1", crmSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.raw, "receiver-credential-s3cret")
	require.Contains(t, r.raw, "0af7651916cd43dd8448eb211c80319c") // harmless headers stay

	r = b.do(t, "GET", "/v1/intents", crmSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.raw, "receiver-credential-s3cret")

	// The same request again (201 → 200 Idempotent-Replayed) returns the stored row.
	r = b.do(t, "POST", "/v1/intents", crmSecret, "app-1", `{"connector":"webhook:crm","payload":{"n":1}}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.raw, "receiver-credential-s3cret")

	r = b.do(t, "POST", "/v1/intents/app-1/cancel", adminSecret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.raw, "receiver-credential-s3cret")
}

// Ordering keys are one namespace for every connector, and a row holds back the later
// rows of its key while it waits (not_before far ahead, awaiting approval). A token
// scoped to some connectors therefore has its ordering keys to itself: it cannot hold
// back rows it may not write, read or cancel. A token allowed every connector shares
// the application's keys.
func TestScopedTokensHaveTheirOwnOrderingKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	body := `{"connector":"webhook:crm","payload":{"n":1},"ordering_key":"customer-42"}`
	r := b.do(t, "POST", "/v1/intents", crmSecret, "crm-1", body)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	require.Contains(t, r.raw, `"ordering_key":"token:crm/customer-42"`)
	// The same request again is the same intent.
	r = b.do(t, "POST", "/v1/intents", crmSecret, "crm-1", body)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))

	r = b.do(t, "POST", "/v1/intents", adminSecret, "admin-1", body)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	require.Contains(t, r.raw, `"ordering_key":"customer-42"`)

	// Kept within the token, a key may no longer fit: one clear error, nothing written.
	long := strings.Repeat("k", outbox.MaxKeyLength)
	r = b.do(t, "POST", "/v1/intents", crmSecret, "crm-2", `{"connector":"webhook:crm","payload":{"n":2},"ordering_key":"`+long+`"}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, r.raw)
	require.Contains(t, r.raw, "kept within token")
	_, err := outbox.Get(t.Context(), b.pool, "crm-2")
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

// A scoped token's ordering keys are its own (README): another scoped token, whose name
// the first one's begins with followed by "/", must not be able to name them.
func TestScopedOrderingKeysDoNotCollideAcrossTokenNames(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	a := &intent.Token{Name: "team", Connectors: []string{"webhook:a"}}
	ab := &intent.Token{Name: "team/b", Connectors: []string{"webhook:b"}}
	svc := &intent.Service{Pool: pool, Policy: &intent.Policy{Tokens: []intent.Token{*a, *ab}}}

	victim, err := svc.Create(t.Context(), ab, "b-1", intent.CreateRequest{
		Connector: "webhook:b", Payload: json.RawMessage(`{"n":1}`), OrderingKey: "x"})
	require.NoError(t, err)
	other, err := svc.Create(t.Context(), a, "a-1", intent.CreateRequest{
		Connector: "webhook:a", Payload: json.RawMessage(`{"n":1}`), OrderingKey: "b/x"})
	require.NoError(t, err)
	require.NotEqual(t, victim.OrderingKey, other.OrderingKey,
		"token %q's ordering key reaches token %q's namespace", a.Name, ab.Name)
}

// The same request under the same key, by the same token, is the same intent (200,
// Idempotent-Replayed), also after an operator widened the token's connectors to "*",
// or narrowed them.
func TestScopeChangeKeepsIdempotentReplay(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	req := intent.CreateRequest{Connector: "webhook:crm", Payload: json.RawMessage(`{"n":1}`), OrderingKey: "customer-42"}

	scoped := &intent.Token{Name: "crm", Connectors: []string{"webhook:crm"}}
	svc := &intent.Service{Pool: pool, Policy: &intent.Policy{Tokens: []intent.Token{*scoped}}}
	first, err := svc.Create(t.Context(), scoped, "k-1", req)
	require.NoError(t, err)
	require.True(t, first.Inserted)

	widened := &intent.Token{Name: "crm", Connectors: []string{"*"}}
	again, err := svc.Create(t.Context(), widened, "k-1", req)
	require.NoError(t, err, "the same request by the same token after its scope widened")
	require.False(t, again.Inserted)
	require.Equal(t, first.ID, again.ID)

	// And the other way: written while allowed everything, retried once scoped.
	first, err = svc.Create(t.Context(), widened, "k-2", req)
	require.NoError(t, err)
	again, err = svc.Create(t.Context(), scoped, "k-2", req)
	require.NoError(t, err, "the same request by the same token after its scope narrowed")
	require.False(t, again.Inserted)
	require.Equal(t, first.ID, again.ID)
}

// An ordering key written while the token was allowed everything may be too long to keep
// within the token once it is scoped: the same request retried is still the same intent,
// not "invalid", which tells the client to change a request that was written.
func TestScopeNarrowedReplaysAnOrderingKeyTooLongToScope(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	req := intent.CreateRequest{Connector: "webhook:crm", Payload: json.RawMessage(`{"n":1}`),
		OrderingKey: strings.Repeat("k", outbox.MaxKeyLength)}
	widened := &intent.Token{Name: "crm", Connectors: []string{"*"}}
	scoped := &intent.Token{Name: "crm", Connectors: []string{"webhook:crm"}}
	svc := &intent.Service{Pool: pool, Policy: &intent.Policy{Tokens: []intent.Token{*scoped}}}

	first, err := svc.Create(t.Context(), widened, "k-1", req)
	require.NoError(t, err)
	again, err := svc.Create(t.Context(), scoped, "k-1", req)
	require.NoError(t, err, "the same request by the same token after its scope narrowed")
	require.False(t, again.Inserted)
	require.Equal(t, first.ID, again.ID)

	// Another token's row is no replay: the scoped key is still too long for it.
	other := &intent.Token{Name: "other", Connectors: []string{"webhook:crm"}}
	_, err = svc.Create(t.Context(), other, "k-1", req)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorContains(t, err, "kept within token")
}

// A scoped token's intents show their ordering key as stored, token:<name>/<key>, and a
// client (an agent told so by propose_intent) that sends that key back for its next intent
// means the same ordering key: prefixed again, the two were not ordered with each other.
func TestScopedOrderingKeySentBackAsShownIsTheSameKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	tok := &intent.Token{Name: "team/b", Connectors: []string{"webhook:crm"}}
	svc := &intent.Service{Pool: pool, Policy: &intent.Policy{Tokens: []intent.Token{*tok}}}

	first, err := svc.Create(t.Context(), tok, "k-1", intent.CreateRequest{
		Connector: "webhook:crm", Payload: json.RawMessage(`{"n":1}`), OrderingKey: "customer-42"})
	require.NoError(t, err)
	require.Equal(t, "token:team%2Fb/customer-42", first.OrderingKey)
	next, err := svc.Create(t.Context(), tok, "k-2", intent.CreateRequest{
		Connector: "webhook:crm", Payload: json.RawMessage(`{"n":2}`), OrderingKey: first.OrderingKey})
	require.NoError(t, err)
	require.Equal(t, first.OrderingKey, next.OrderingKey, "the ordering key as shown names the same key")

	// A row written before, prefixed twice, is still that request's intent.
	_, err = pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, ordering_key, created_by)
		VALUES ('k-old', 'webhook:crm', '{"n":3}', 'token:team%2Fb/token:team%2Fb/customer-42', 'team/b')`)
	require.NoError(t, err)
	old, err := svc.Create(t.Context(), tok, "k-old", intent.CreateRequest{
		Connector: "webhook:crm", Payload: json.RawMessage(`{"n":3}`), OrderingKey: first.OrderingKey})
	require.NoError(t, err)
	require.False(t, old.Inserted)
}
