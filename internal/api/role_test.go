package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// The intent API runs as a role with exactly the grants the README gives outboxd serve
// with the API enabled (the relay's, INSERT on outbox and SELECT, INSERT on outbox_audit): it creates,
// reads, lists, approves, rejects and cancels.
func TestAPIWorksWithTheREADMEsPrivileges(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := t.Context()
	rolePool := pgtest.PoolAs(t, pool, pgtest.Role(t, pool, "outboxd_serve_",
		`GRANT SELECT, UPDATE, DELETE ON outbox TO ROLE_`,
		`GRANT SELECT, INSERT, DELETE ON outbox_attempts TO ROLE_`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_wake_connectors TO ROLE_`,
		`GRANT SELECT ON outbox_schema_migrations TO ROLE_`,
		`GRANT INSERT ON outbox TO ROLE_`,
		`GRANT SELECT, INSERT ON outbox_audit TO ROLE_`))

	svc := &intent.Service{Pool: rolePool, Policy: &intent.Policy{
		Tokens: []intent.Token{
			{Name: "agent", SHA256: hash(agentSecret), Connectors: []string{"webhook", "payment"}},
			{Name: "admin", SHA256: hash(adminSecret), Connectors: []string{"*"}, Admin: true},
		},
		ApprovalRequired: []string{"payment"},
	}}
	b := serveAPI(t, pool, svc, nil)

	for _, key := range []string{"pay-1", "pay-2"} {
		res := b.do(t, "POST", "/v1/intents", agentSecret, key, `{"connector":"payment","payload":`+paymentPayload+`}`)
		require.Equal(t, http.StatusCreated, res.status, res.raw)
	}
	res := b.do(t, "POST", "/v1/intents", agentSecret, "hook-1", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, http.StatusCreated, res.status, res.raw)
	res = b.do(t, "GET", "/v1/intents/hook-1", agentSecret, "", "")
	require.Equal(t, http.StatusOK, res.status, res.raw)
	res = b.do(t, "GET", "/v1/intents", agentSecret, "", "")
	require.Equal(t, http.StatusOK, res.status, res.raw)

	for _, c := range []struct{ path, status string }{
		{"/v1/intents/pay-1/approve", outbox.StatusPending},
		{"/v1/intents/pay-2/reject", outbox.StatusCanceled},
		{"/v1/intents/hook-1/cancel", outbox.StatusCanceled},
	} {
		res = b.do(t, "POST", c.path, adminSecret, "", `{"reason":"checked"}`)
		require.Equal(t, http.StatusOK, res.status, "%s: %s", c.path, res.raw)
		require.Equal(t, c.status, res.body["status"], c.path)
	}
	var audits int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_audit`).Scan(&audits))
	require.Equal(t, 3, audits)
}
