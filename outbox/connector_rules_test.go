package outbox_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Messages that the connector of their kind refuses as permanent on the first attempt,
// without sending, were accepted by outbox.Enqueue (and so the API and MCP): the row went
// to dead instead of the caller getting one clear ErrInvalidMessage. Each case first
// shows the connector's refusal (and that nothing reached the receiver), then that
// Enqueue refuses it too.
func TestEnqueueRefusesWhatTheConnectorRefuses(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"pi_1","object":"payment_intent"}`))
	}))
	t.Cleanup(rcv.Close)
	hook, err := webhook.New(webhook.Config{URL: rcv.URL})
	require.NoError(t, err)
	pay, err := payment.New(payment.Config{APIKey: "sk_test_1", APIBase: rcv.URL, Timeout: 5 * time.Second})
	require.NoError(t, err)
	mail, err := email.New(email.Config{Addr: "127.0.0.1:1", From: "shop@example.com", Timeout: 5 * time.Second})
	require.NoError(t, err)

	cases := []struct {
		name    string
		msg     outbox.Message
		key     string
		refused func(d connectors.Delivery) error // the connector's verdict
	}{
		{"payment with an extra field", outbox.Message{Connector: "payment",
			Payload: json.RawMessage(`{"operation":"payment_intent.create","params":{"amount":1,"currency":"eur"},"note":"x"}`)},
			"",
			func(d connectors.Delivery) error { _, err := pay.Deliver(t.Context(), d); return err }},
		{"email with a misspelt field", outbox.Message{Connector: "email",
			Payload: json.RawMessage(`{"to":"a@example.com","subject":"s","text":"t","body":"the real text"}`)},
			"",
			func(d connectors.Delivery) error { _, err := mail.Deliver(t.Context(), d); return err }},
		{"email overriding From", outbox.Message{Connector: "email",
			Payload: json.RawMessage(`{"to":"a@example.com","subject":"s","text":"t","headers":{"From":"ceo@example.com"}}`)},
			"",
			func(d connectors.Delivery) error { _, err := mail.Deliver(t.Context(), d); return err }},
		{"slack channel by name", outbox.Message{Connector: "slack",
			Payload: json.RawMessage(`{"channel":"#general","text":"hi"}`)},
			"",
			func(d connectors.Delivery) error { return slack.ValidatePayload(d.Payload) }},
		{"slack thread_ts written as a float", outbox.Message{Connector: "slack",
			Payload: json.RawMessage(`{"channel":"C01","text":"t","thread_ts":"1602251441.0017"}`)},
			"",
			func(d connectors.Delivery) error { return slack.ValidatePayload(d.Payload) }},
		{"slack with an extra field", outbox.Message{Connector: "slack",
			Payload: json.RawMessage(`{"channel":"C0123456","text":"hi","username":"bot"}`)},
			"",
			func(d connectors.Delivery) error { return slack.ValidatePayload(d.Payload) }},
		{"email with a number for its text", outbox.Message{Connector: "email",
			Payload: json.RawMessage(`{"to":"a@example.com","subject":"s","html":"<p>x</p>","text":5}`)},
			"",
			func(d connectors.Delivery) error { _, err := mail.Deliver(t.Context(), d); return err }},
		{"email with a boolean for its html", outbox.Message{Connector: "email",
			Payload: json.RawMessage(`{"to":"a@example.com","subject":"s","text":"t","html":true}`)},
			"",
			func(d connectors.Delivery) error { _, err := mail.Deliver(t.Context(), d); return err }},
		{"slack with a number for its text", outbox.Message{Connector: "slack",
			Payload: json.RawMessage(`{"channel":"C0123456","blocks":[{"type":"divider"}],"text":5}`)},
			"",
			func(d connectors.Delivery) error { return slack.ValidatePayload(d.Payload) }},
		{"slack with blocks Block Kit does not take", outbox.Message{Connector: "slack",
			Payload: json.RawMessage(`{"channel":"C0123456","text":"hi","blocks":[{"type":"section","text":5}]}`)},
			"",
			func(d connectors.Delivery) error { return slack.ValidatePayload(d.Payload) }},
		{"payment key of 200 characters, 400 bytes", outbox.Message{Connector: "payment",
			Payload: json.RawMessage(`{"operation":"payment_intent.create","params":{"amount":1,"currency":"eur"}}`)},
			strings.Repeat("é", 200),
			func(d connectors.Delivery) error { _, err := pay.Deliver(t.Context(), d); return err }},
		{"payment key ending in a no-break space", outbox.Message{Connector: "payment",
			Payload: json.RawMessage(`{"operation":"payment_intent.create","params":{"amount":1,"currency":"eur"}}`)},
			"order-42/charge ",
			func(d connectors.Delivery) error { _, err := pay.Deliver(t.Context(), d); return err }},
		{"webhook row header with a control character", outbox.Message{Connector: "webhook",
			Payload: json.RawMessage(`{"a":1}`), Headers: map[string]string{"x-trace": "a\x01b"}},
			"",
			func(d connectors.Delivery) error { _, err := hook.Deliver(t.Context(), d); return err }},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.msg.Key = "review-" + string(rune('a'+i))
			if c.key != "" {
				c.msg.Key = c.key
			}
			before := hits.Load()
			err := c.refused(connectors.Delivery{Key: c.msg.Key, Attempt: 1, Payload: c.msg.Payload.(json.RawMessage), Headers: c.msg.Headers})
			require.Error(t, err, "the connector refuses it")
			if c.msg.Connector != "slack" {
				require.True(t, connectors.IsPermanent(err), "permanently: %v", err)
			}
			require.Equal(t, before, hits.Load(), "without sending anything")
			t.Logf("connector: %v", err)

			tx := pgtest.Tx(t)
			_, err = outbox.Enqueue(context.WithoutCancel(t.Context()), tx, c.msg)
			require.ErrorIs(t, err, outbox.ErrInvalidMessage, "Enqueue accepted a message its connector sends to dead unsent")
			require.NotContains(t, err.Error(), "payload: payload", "the payload is named once")
		})
	}
}
