package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// The approval flow end to end: an agent's intent waits for a person, the relay leaves it
// alone until then, and once approved it is delivered exactly once to a receiver that
// enforces keys — however often it is approved or proposed again.
func TestApprovalFlowToDelivery(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	rcv, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	svc := &intent.Service{Pool: pool, Policy: &intent.Policy{
		Tokens: []intent.Token{
			{Name: "agent", SHA256: hash(agentSecret), Connectors: []string{"webhook:*"}},
			{Name: "admin", SHA256: hash(adminSecret), Connectors: []string{"*"}, Admin: true},
		},
		ApprovalRequired: []string{"webhook:risky"},
	}}
	b := serveAPI(t, pool, svc, nil)

	newHook := func() connectors.Connector {
		h, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced})
		require.NoError(t, err)
		return h
	}
	r, err := relay.New(pool, &relay.Config{PollInterval: 50 * time.Millisecond, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		map[string]relay.Instance{"webhook": {Connector: newHook()}, "webhook:risky": {Connector: newHook()}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	waitStatus := func(key, status string) {
		t.Helper()
		require.Eventually(t, func() bool {
			in, err := outbox.Get(t.Context(), pool, key)
			return err == nil && in.Status == status
		}, time.Minute, 10*time.Millisecond, "%s never became %s", key, status)
	}

	res := b.do(t, "POST", "/v1/intents", agentSecret, "wire-1", `{"connector":"webhook:risky","payload":{"amount":500}}`)
	require.Equal(t, http.StatusCreated, res.status, res.raw)
	require.Equal(t, outbox.StatusAwaitingApproval, res.body["status"])

	// A row enqueued after it and delivered shows the relay had its chance: the intent
	// awaiting approval was left alone.
	res = b.do(t, "POST", "/v1/intents", agentSecret, "harmless-1", `{"connector":"webhook","payload":{}}`)
	require.Equal(t, http.StatusCreated, res.status, res.raw)
	waitStatus("harmless-1", outbox.StatusDelivered)
	require.Zero(t, rcv.Requests("wire-1"))

	res = b.do(t, "POST", "/v1/intents/wire-1/approve", adminSecret, "", `{"reason":"checked the amount"}`)
	require.Equal(t, http.StatusOK, res.status, res.raw)
	waitStatus("wire-1", outbox.StatusDelivered)

	// Approving again and proposing the same decision again change nothing.
	res = b.do(t, "POST", "/v1/intents/wire-1/approve", adminSecret, "", "")
	require.Equal(t, http.StatusOK, res.status, res.raw)
	res = b.do(t, "POST", "/v1/intents", agentSecret, "wire-1", `{"connector":"webhook:risky","payload":{"amount":500}}`)
	require.Equal(t, http.StatusOK, res.status, res.raw)
	require.Equal(t, "true", res.header.Get("Idempotent-Replayed"))
	require.Equal(t, outbox.StatusDelivered, res.body["status"])

	require.Equal(t, 1, rcv.Effects("wire-1"))
	// The receiver enforces keys: only its request count shows a row sent again.
	require.Equal(t, 1, rcv.Requests("wire-1"), "approving again sent nothing")
	require.Empty(t, rcv.DuplicateKeys())
	in, err := outbox.Get(t.Context(), pool, "wire-1")
	require.NoError(t, err)
	require.Equal(t, "agent", in.CreatedBy)
}
