package api_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/api"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// The intent API runs as a role with exactly the grants the README gives outboxd serve
// with the API enabled (the relay's, and SELECT, INSERT on outbox_audit): it creates,
// reads, lists, approves, rejects and cancels.
func TestAPIWorksWithTheREADMEsPrivileges(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := t.Context()
	var mayCreate bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&mayCreate))
	if !mayCreate {
		t.Skip("the test database's role may not create roles")
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	role := "outboxd_serve_" + hex.EncodeToString(suffix)
	id := pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		`CREATE ROLE ` + id + ` LOGIN`,
		`GRANT USAGE ON SCHEMA public TO ` + id,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON outbox, outbox_attempts, outbox_wake_connectors TO ` + id,
		`GRANT SELECT ON outbox_schema_migrations TO ` + id,
		`GRANT SELECT, INSERT ON outbox_audit TO ` + id,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, err := pool.Exec(ctx, `DROP OWNED BY `+id)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `DROP ROLE `+id)
		require.NoError(t, err)
	})
	pcfg := pool.Config().Copy()
	pcfg.ConnConfig.User = role
	rolePool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(rolePool.Close)

	svc := &intent.Service{Pool: rolePool, Policy: &intent.Policy{
		Tokens: []intent.Token{
			{Name: "agent", SHA256: hash(agentSecret), Connectors: []string{"webhook", "payment"}},
			{Name: "admin", SHA256: hash(adminSecret), Connectors: []string{"*"}, Admin: true},
		},
		ApprovalRequired: []string{"payment"},
	}}
	mux := http.NewServeMux()
	mux.Handle("/v1/", api.New(svc, &api.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	b := &testBundle{pool: pool, url: srv.URL}

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
