package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// webhookAdminSecret is an admin token's whose scope is the webhook connector alone.
const webhookAdminSecret = "obx_webhook-admin-secret-value"

// tracedService is setup's database with a service whose pool runs a hook, and tokens
// admin, admin2 and webhook-admin; payment and webhook intents await approval. The hook,
// when armed, runs its Func right after the first statement reading one intent by key
// (outbox.Get) ends: the moment between the API's checks of an intent and the decision's
// own transaction.
func tracedService(t *testing.T) (*testBundle, *pgtest.Hook, *intent.Service) {
	t.Helper()
	base := setup(t, options{}) // its own database; pool without a tracer
	tr := &pgtest.Hook{Match: func(sql string) bool {
		return strings.Contains(sql, "FROM outbox WHERE idempotency_key = $1") && !strings.Contains(sql, "FOR UPDATE")
	}}
	pool := pgtest.PoolWith(t, base.pool, tr)
	return base, tr, &intent.Service{Pool: pool, Policy: &intent.Policy{
		Tokens: []intent.Token{
			{Name: "admin", SHA256: hash(adminSecret), Connectors: []string{"*"}, Admin: true},
			{Name: "admin2", SHA256: hash(admin2Secret), Connectors: []string{"*"}, Admin: true},
			{Name: "webhook-admin", SHA256: hash(webhookAdminSecret), Connectors: []string{"webhook"}, Admin: true},
		},
		ApprovalRequired: []string{"payment", "webhook"},
	}}
}

// A rejection or cancel checks the token's scope on the row it locks: an admin token
// scoped to webhook rejects (or cancels) key pay-1 while it is a canceled webhook intent
// (a decision sent again is harmless); in between, that row is purged and pay-1 proposed
// again as a payment, which the token may not see. It is not rejected or canceled (404,
// as for any intent the token may not see).
func TestScopedDecisionDoesNotReachAReplacementOutOfScope(t *testing.T) {
	for _, action := range []string{"reject", "cancel"} {
		t.Run(action, func(t *testing.T) {
			base, tr, svc := tracedService(t)
			b := serveAPI(t, base.pool, svc, nil)
			r := b.do(t, "POST", "/v1/intents", adminSecret, "pay-1", `{"connector":"webhook","payload":{"a":1}}`)
			require.Equal(t, http.StatusCreated, r.status, r.raw)
			r = b.do(t, "POST", "/v1/intents/pay-1/"+action, admin2Secret, "", "")
			require.Equal(t, http.StatusOK, r.status, r.raw)
			require.Equal(t, "canceled", r.body["status"])

			var again response
			var hookErr error
			tr.Func = func() {
				// Runs on the server's goroutine: no require here.
				if _, hookErr = ops.Purge(context.Background(), base.pool, 0, ops.PurgeOptions{Now: time.Now().Add(time.Hour)}); hookErr == nil {
					again = b.do(t, "POST", "/v1/intents", adminSecret, "pay-1", `{"connector":"payment","payload":`+paymentPayload+`}`)
				}
			}
			tr.Arm()
			r = b.do(t, "POST", "/v1/intents/pay-1/"+action, webhookAdminSecret, "", "")
			require.True(t, tr.Ran(), "the hook ran")
			require.NoError(t, hookErr)
			require.Equal(t, http.StatusCreated, again.status, again.raw)

			var status, connector string
			require.NoError(t, base.pool.QueryRow(t.Context(),
				`SELECT status, connector FROM outbox WHERE idempotency_key = 'pay-1'`).Scan(&status, &connector))
			require.Equal(t, "payment", connector)
			require.Equal(t, "awaiting_approval", status, "a token scoped to webhook decided on a payment; answer: %d %s", r.status, r.raw)
			require.Equal(t, http.StatusNotFound, r.status, r.raw)
		})
	}
}

// The token that proposed an intent awaiting approval cannot approve it (README: 403,
// even an admin token). The API checks who proposed the intent on a read of the row
// before the approval's own transaction, which then approves whatever row holds the key
// when it locks it. A rejected intent deleted by retention (or purge) in between, and
// proposed again by the same token under the same key, is then approved by its
// proposer: the gate's second pair of eyes is the proposer's own.
func TestProposerCannotApproveWhenTheKeysRowIsReplacedMidApproval(t *testing.T) {
	base, tr, svc := tracedService(t)
	b := serveAPI(t, base.pool, svc, nil)
	body := `{"connector":"payment","payload":` + paymentPayload + `}`

	// The agent's admin token proposes; another approver rejects.
	r := b.do(t, "POST", "/v1/intents", adminSecret, "pay-1", body)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	r = b.do(t, "POST", "/v1/intents/pay-1/reject", admin2Secret, "", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "canceled", r.body["status"])

	// While the proposer's approve runs: retention deletes the rejected row, and the
	// proposer proposes the same request again (the key is free: 201).
	var purged int
	var again response
	var hookErr error
	tr.Func = func() {
		// Runs on the server's goroutine: no require here.
		res, err := ops.Purge(context.Background(), base.pool, 0, ops.PurgeOptions{Now: time.Now().Add(time.Hour)})
		purged, hookErr = res.Rows, err
		if err == nil {
			again = b.do(t, "POST", "/v1/intents", adminSecret, "pay-1", body)
		}
	}
	tr.Arm()
	r = b.do(t, "POST", "/v1/intents/pay-1/approve", adminSecret, "", "")
	require.True(t, tr.Ran(), "the hook ran")
	require.NoError(t, hookErr)
	require.Equal(t, 1, purged, "retention deleted the rejected row")
	require.Equal(t, http.StatusCreated, again.status, again.raw)
	require.Equal(t, "awaiting_approval", again.body["status"])
	require.Equal(t, "admin", again.body["created_by"])

	var status, createdBy string
	require.NoError(t, base.pool.QueryRow(t.Context(),
		`SELECT status, created_by FROM outbox WHERE idempotency_key = 'pay-1'`).Scan(&status, &createdBy))
	require.Equal(t, "admin", createdBy)
	require.Equal(t, "awaiting_approval", status, "the proposer approved its own intent; answer: %d %s", r.status, r.raw)
	require.Contains(t, []int{http.StatusForbidden, http.StatusConflict, http.StatusNotFound}, r.status, r.raw)
}
