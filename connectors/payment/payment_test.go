package payment_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/internal/stripemocktest"
)

const testKey = "sk_test_123"

type testBundle struct {
	f *fakeStripe
	c *payment.Connector
}

// setup starts a fake Stripe and a connector for it on a transport of the test's own.
func setup(t *testing.T) *testBundle {
	t.Helper()
	f := startFake(t)
	return &testBundle{f: f, c: newConnector(t, f.URL())}
}

func newConnector(t *testing.T, base string) *payment.Connector {
	t.Helper()
	tr := payment.DefaultTransport().Clone()
	t.Cleanup(tr.CloseIdleConnections)
	c, err := payment.New(payment.Config{APIKey: testKey, APIBase: base, HTTPClient: &http.Client{Transport: tr}})
	require.NoError(t, err)
	return c
}

func delivery(key, payload string) connectors.Delivery {
	return connectors.Delivery{
		Key:     key,
		Attempt: 1,
		Payload: json.RawMessage(payload),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

const createPI = `{"operation":"payment_intent.create","params":{"amount":2000,"currency":"usd","payment_method_types":["card"],"metadata":{"order":"42"}}}`

func decode(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m), "result %s", raw)
	return m
}

func TestStripeMock(t *testing.T) {
	t.Parallel()
	c := newConnector(t, stripemocktest.Start(t))

	for _, tc := range []struct {
		name, payload, object string
		livemode              bool // whether the object has a livemode field (a Refund has none)
	}{
		{"CustomerCreate", `{"operation":"customer.create","params":{"email":"jane@example.com","name":"Jane","metadata":{"user":"7"}}}`, "customer", true},
		{"PaymentIntentCreate", createPI, "payment_intent", true},
		{"PaymentIntentConfirm", `{"operation":"payment_intent.confirm","params":{"id":"pi_123","payment_method":"pm_card_visa"}}`, "payment_intent", true},
		{"PaymentIntentCancel", `{"operation":"payment_intent.cancel","params":{"id":"pi_123","cancellation_reason":"requested_by_customer"}}`, "payment_intent", true},
		{"RefundCreate", `{"operation":"refund.create","params":{"payment_intent":"pi_123","amount":500}}`, "refund", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw, err := c.Deliver(t.Context(), delivery("stripe-mock:"+tc.name, tc.payload))
			require.NoError(t, err)
			res := decode(t, raw)
			require.Equal(t, tc.object, res["object"], "result %s", raw)
			require.NotEmpty(t, res["id"], "result %s", raw)
			if tc.livemode {
				require.Equal(t, false, res["livemode"], "result %s", raw)
			} else {
				require.NotContains(t, res, "livemode", "result %s", raw)
			}
		})
	}

	// stripe-mock validates parameters against Stripe's OpenAPI spec.
	t.Run("MissingRequiredParam", func(t *testing.T) {
		t.Parallel()
		// Refused before sending (see TestCheckPayload_RequiredParamsOfPaymentIntentCreate);
		// a param stripe-mock requires that the connector does not check is Stripe's answer.
		raw, err := c.Deliver(t.Context(), delivery("stripe-mock:missing", `{"operation":"payment_intent.create","params":{"amount":2000}}`))
		require.Error(t, err)
		require.Nil(t, raw)
		require.True(t, connectors.IsPermanent(err), "%v", err)
		require.Contains(t, err.Error(), "currency")
		raw, err = c.Deliver(t.Context(), delivery("stripe-mock:missing-data", `{"operation":"payment_intent.create","params":{"amount":2000,"currency":"usd","payment_method_data":{"billing_details":{"name":"Jane"}}}}`))
		require.Error(t, err)
		require.Equal(t, float64(http.StatusBadRequest), decode(t, raw)["status"], "Stripe's answer is stored: %s", raw)
		require.True(t, connectors.IsPermanent(err), "%v", err)
		require.Contains(t, err.Error(), "invalid_request_error")
	})

	t.Run("UnknownParam", func(t *testing.T) {
		t.Parallel()
		_, err := c.Deliver(t.Context(), delivery("stripe-mock:unknown", `{"operation":"payment_intent.create","params":{"amount":2000,"currency":"usd","colour":"red"}}`))
		require.True(t, connectors.IsPermanent(err), "%v", err)
		require.Contains(t, err.Error(), `unknown parameter "colour"`)
	})
}

func TestConformance(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	c, err := payment.New(payment.Config{APIKey: testKey, APIBase: f.URL()}) // the shared transport, as in production
	require.NoError(t, err)
	connectortest.Run(t, connectortest.Harness{
		Connector: c,
		PayloadFunc: func(i int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"operation":"payment_intent.create","params":{"amount":%d,"currency":"usd"}}`, 100+i))
		},
		EffectsFunc:         f.Effects,
		RequestsFunc:        func(key string) int { return len(f.Requests(key)) },
		DropAfterEffectFunc: func(key string) { f.Plan(key, action{DropAfterEffect: true}) },
	})
}

func TestDeliver_Success(t *testing.T) {
	t.Parallel()
	b := setup(t)

	raw, err := b.c.Deliver(t.Context(), delivery("order-42:charge/stripe", createPI))
	require.NoError(t, err)
	require.JSONEq(t, `{"object":"payment_intent","id":"pi_fake1","status":"requires_payment_method","livemode":false,"amount":2000,"currency":"usd"}`, string(raw))

	reqs := b.f.Requests("order-42:charge/stripe")
	require.Len(t, reqs, 1)
	r := reqs[0]
	require.Equal(t, "/v1/payment_intents", r.Path)
	require.Equal(t, "Bearer "+testKey, r.Header.Get("Authorization"))
	require.Equal(t, "2000", r.Form.Get("amount"))
	require.Equal(t, "usd", r.Form.Get("currency"))
	require.Equal(t, "card", r.Form.Get("payment_method_types[0]"), "snake_case params reach Stripe: %v", r.Form)
	require.Equal(t, "42", r.Form.Get("metadata[order]"))
	require.Equal(t, connectors.Enforced, b.c.Guarantee())
}

func TestDeliver_Operations(t *testing.T) {
	t.Parallel()
	b := setup(t)

	for _, tc := range []struct {
		name, payload, path, want string
	}{
		{"Confirm", `{"operation":"payment_intent.confirm","params":{"id":"pi_9","payment_method":"pm_card_visa"}}`,
			"/v1/payment_intents/pi_9/confirm", `{"object":"payment_intent","id":"pi_9","status":"succeeded","livemode":false,"amount":1000,"currency":"usd"}`},
		{"Cancel", `{"operation":"payment_intent.cancel","params":{"id":"pi_9"}}`,
			"/v1/payment_intents/pi_9/cancel", `{"object":"payment_intent","id":"pi_9","status":"canceled","livemode":false,"amount":1000,"currency":"usd"}`},
		{"Refund", `{"operation":"refund.create","params":{"payment_intent":"pi_9","amount":300}}`,
			"/v1/refunds", ``},
		{"Customer", `{"operation":"customer.create","params":{"email":"jane@example.com"}}`,
			"/v1/customers", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "op:" + tc.name
			raw, err := b.c.Deliver(t.Context(), delivery(key, tc.payload))
			require.NoError(t, err)
			if tc.want != "" {
				require.JSONEq(t, tc.want, string(raw))
			}
			reqs := b.f.Requests(key)
			require.Len(t, reqs, 1)
			require.Equal(t, tc.path, reqs[0].Path)
			require.Empty(t, reqs[0].Form.Get("id"), "the id travels in the path only")
			require.Equal(t, key, reqs[0].Header.Get("Idempotency-Key"))
		})
	}
}

// The first attempt fails, the second succeeds; both carry the row's key.
func TestDeliver_RetryCarriesSameKey(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name      string
		first     action
		ambiguous bool
	}{
		// Stripe's outcome after a 500 is unknown; this one failed before it ran, so the
		// retry (with the same key) does the work.
		{"500", action{Status: http.StatusInternalServerError, Body: `{"error":{"type":"api_error","message":"Something went wrong"}}`}, true},
		{"DropBeforeEffect", action{DropBeforeEffect: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const key = "order-7:charge"
			b.f.Plan(key, tc.first)

			raw, err := b.c.Deliver(t.Context(), delivery(key, createPI))
			require.Error(t, err)
			if tc.first.Status != 0 {
				require.Equal(t, float64(tc.first.Status), decode(t, raw)["status"], "Stripe's answer is stored: %s", raw)
			} else {
				require.Nil(t, raw)
			}
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.Equal(t, tc.ambiguous, connectors.IsAmbiguous(err), "%v", err)
			require.Len(t, b.f.Requests(key), 1, "stripe-go's own retries are off")
			require.Equal(t, 0, b.f.Effects(key))

			d := delivery(key, createPI)
			d.Attempt, d.PreviousAmbiguous = 2, tc.ambiguous
			raw, err = b.c.Deliver(t.Context(), d)
			require.NoError(t, err)
			require.Equal(t, "payment_intent", decode(t, raw)["object"])

			reqs := b.f.Requests(key)
			require.Len(t, reqs, 2)
			for _, r := range reqs {
				require.Equal(t, key, r.Header.Get("Idempotency-Key"))
			}
			require.Equal(t, 1, b.f.Effects(key))
		})
	}
}

// The failure that matters most: Stripe charges, then the connection drops before the
// answer. The retry with the same key gets the stored answer; one charge.
func TestDeliver_DropAfterEffect(t *testing.T) {
	t.Parallel()

	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("ReusedConnection=%t", warm), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if warm {
				// On a reused connection net/http would resend the request by itself.
				_, err := b.c.Deliver(t.Context(), delivery("warm-up", createPI))
				require.NoError(t, err)
			}
			const key = "order-8:charge"
			b.f.Plan(key, action{DropAfterEffect: true})

			raw, err := b.c.Deliver(t.Context(), delivery(key, createPI))
			require.Error(t, err)
			require.Nil(t, raw)
			require.True(t, connectors.IsAmbiguous(err), "%v", err)
			require.False(t, connectors.IsPermanent(err))
			require.Contains(t, err.Error(), "Stripe may have acted")
			require.Len(t, b.f.Requests(key), 1, "neither stripe-go nor net/http resent on its own")
			require.Equal(t, 1, b.f.Effects(key))

			d := delivery(key, createPI)
			d.Attempt, d.PreviousAmbiguous = 2, true
			raw, err = b.c.Deliver(t.Context(), d)
			require.NoError(t, err)
			res := decode(t, raw)
			require.Equal(t, "payment_intent", res["object"])
			require.Equal(t, true, res["idempotent_replayed"], "the stored answer came back: %s", raw)
			require.Equal(t, 1, b.f.Effects(key))
			reqs := b.f.Requests(key)
			require.Len(t, reqs, 2)
			require.Equal(t, reqs[0].Header.Get("Idempotency-Key"), reqs[1].Header.Get("Idempotency-Key"))
		})
	}
}

func TestDeliver_Classification(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name      string
		answer    action
		permanent bool
		ambiguous bool
		delay     time.Duration // 0: no Retry-After
		contains  string
		unsaved   bool // an answer Stripe saved nothing for, so none is stored
	}{
		{
			name:      "IdempotencyError",
			answer:    action{Status: http.StatusBadRequest, Body: `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`},
			permanent: true,
			contains:  "Keys for idempotent requests can only be used with the same parameters",
		},
		{
			name:      "InvalidRequest",
			answer:    action{Status: http.StatusBadRequest, Body: `{"error":{"type":"invalid_request_error","code":"parameter_invalid_integer","param":"amount","message":"Invalid integer: abc"}}`},
			permanent: true,
			contains:  "Invalid integer: abc (parameter_invalid_integer)",
		},
		{
			name:      "Unauthorized",
			answer:    action{Status: http.StatusUnauthorized, Body: `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: sk_test_****0000"}}`},
			permanent: true,
			contains:  "401 Unauthorized",
		},
		{
			// A concurrent request with the same key: Stripe sends it as an
			// idempotency_error, but a retry will get the stored answer. The request
			// still running may act, so the outcome is unknown.
			name:      "Conflict",
			answer:    action{Status: http.StatusConflict, Body: `{"error":{"type":"idempotency_error","message":"There is currently another in-progress request using this Idempotent Key."}}`},
			ambiguous: true,
			unsaved:   true,
			contains:  "409 Conflict",
		},
		{
			name:     "TooManyRequests",
			answer:   action{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"7"}}, Body: `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests."}}`},
			delay:    7 * time.Second,
			contains: "429 Too Many Requests",
		},
		{
			name:     "TooManyRequestsNoRetryAfter",
			answer:   action{Status: http.StatusTooManyRequests, Body: `{"error":{"type":"invalid_request_error","code":"lock_timeout","message":"This object cannot be accessed right now."}}`},
			contains: "lock_timeout",
		},
		{
			name:      "ServiceUnavailable",
			answer:    action{Status: http.StatusServiceUnavailable, Body: `{"error":{"type":"api_error","message":"Stripe is unavailable."}}`},
			ambiguous: true, // a 5xx leaves Stripe's outcome unknown
			contains:  "503 Service Unavailable",
		},
		{
			name:      "ServiceUnavailableNotJSON",
			answer:    action{Status: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"text/html"}}, Body: `<html>upstream unavailable</html>`},
			ambiguous: true,
			contains:  "503 Service Unavailable",
		},
		{
			name:      "NotFoundNotJSON",
			answer:    action{Status: http.StatusNotFound, Header: http.Header{"Content-Type": {"text/plain"}}, Body: `no such route`},
			permanent: true,
			contains:  "404 Not Found",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			key := "classify:" + tc.name
			b.f.Plan(key, tc.answer)

			raw, err := b.c.Deliver(t.Context(), delivery(key, createPI))
			require.Error(t, err)
			if strings.HasPrefix(tc.answer.Body, `{"error"`) && (tc.permanent || tc.ambiguous) && !tc.unsaved {
				require.Equal(t, float64(tc.answer.Status), decode(t, raw)["status"], "Stripe's answer is stored: %s", raw)
			} else {
				require.Nil(t, raw)
			}
			require.Equal(t, tc.permanent, connectors.IsPermanent(err), "%v", err)
			require.Equal(t, tc.ambiguous, connectors.IsAmbiguous(err), "%v", err)
			d, ok := connectors.RetryDelay(err)
			require.Equal(t, tc.delay != 0, ok, "%v", err)
			require.Equal(t, tc.delay, d)
			require.Contains(t, err.Error(), tc.contains)
			require.Contains(t, err.Error(), "payment_intent.create at "+b.f.URL())
			require.NotContains(t, err.Error(), testKey)
		})
	}
}

// A card decline is a final outcome, not a failure: the attempt happened, and Stripe
// replays the same decline for the same key.
func TestDeliver_CardErrorIsResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "order-9:charge"
	b.f.Plan(key, action{Status: http.StatusPaymentRequired, Body: `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds.","charge":"ch_1","payment_intent":{"id":"pi_declined","object":"payment_intent","status":"requires_payment_method"}}}`})

	raw, err := b.c.Deliver(t.Context(), delivery(key, createPI))
	require.NoError(t, err)
	require.JSONEq(t, `{"object":"error","type":"card_error","code":"card_declined","decline_code":"insufficient_funds",
		"message":"Your card has insufficient funds.","payment_intent":"pi_declined","charge":"ch_1","request_id":"req_fake"}`, string(raw))
}

// Stripe refuses a key reused with other parameters; so does the fake.
func TestDeliver_KeyReusedWithOtherParams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "order-10:charge"
	_, err := b.c.Deliver(t.Context(), delivery(key, createPI))
	require.NoError(t, err)

	_, err = b.c.Deliver(t.Context(), delivery(key, `{"operation":"payment_intent.create","params":{"amount":9999,"currency":"usd"}}`))
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "idempotency_error")
	require.Contains(t, err.Error(), "Keys for idempotent requests can only be used with the same parameters")
	require.Equal(t, 1, b.f.Effects(key))
}

// Rows the connector refuses are permanent and send nothing.
func TestDeliver_BadPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)

	for _, tc := range []struct {
		name, key, payload, contains string
	}{
		{"NotJSON", "k", `{"operation":`, "the payload is not"},
		{"UnknownTopLevelField", "k", `{"operation":"customer.create","params":{},"extra":1}`, `unknown field "extra"`},
		{"UnknownOperation", "k", `{"operation":"charge.create","params":{}}`, `unknown operation "charge.create"`},
		{"NoOperation", "k", `{"params":{}}`, `unknown operation ""`},
		{"ParamsNotObject", "k", `{"operation":"customer.create","params":[1]}`, "params: must be a JSON object"},
		{"UnknownParam", "k", `{"operation":"payment_intent.create","params":{"amount":1,"currency":"usd","amountt":2}}`, `params: unknown parameter "amountt"`},
		{"UnknownNestedParam", "k", `{"operation":"payment_intent.create","params":{"amount":1,"currency":"usd","automatic_payment_methods":{"enabeld":true}}}`, `params.automatic_payment_methods: unknown parameter "enabeld"`},
		{"WrongType", "k", `{"operation":"payment_intent.create","params":{"amount":"lots","currency":"usd"}}`, "a JSON string cannot go in Amount"},
		{"StripeParamsUnreachable", "k", `{"operation":"customer.create","params":{"idempotency_key":"other"}}`, `unknown parameter "idempotency_key"`},
		{"ConfirmWithoutID", "k", `{"operation":"payment_intent.confirm","params":{"payment_method":"pm_card_visa"}}`, `params: "id" is required`},
		{"CancelBadID", "k", `{"operation":"payment_intent.cancel","params":{"id":"pi_1/../../customers"}}`, `"id" must be`},
		{"CreateWithID", "k", `{"operation":"customer.create","params":{"id":"cus_1"}}`, `unknown parameter "id"`},
		{"NoKey", "", createPI, "no idempotency key"},
		{"KeyTooLong", string(bytes.Repeat([]byte("k"), 256)), createPI, "not a valid Stripe idempotency key"},
		{"KeyNotAHeader", "order-42\nnotify", createPI, "not a valid Stripe idempotency key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw, err := b.c.Deliver(t.Context(), delivery(tc.key, tc.payload))
			require.Error(t, err)
			require.Nil(t, raw)
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), tc.contains)
			require.Empty(t, b.f.Requests(tc.key), "nothing was sent")
		})
	}
}

// A 5xx leaves Stripe's outcome unknown: the attempt is ambiguous, and retried with the
// same key; Stripe then replays the saved 500, which is final.
func TestDeliver_ServerErrorIsAmbiguous(t *testing.T) {
	t.Parallel()
	var seen sync.Map // idempotency keys that were answered once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, again := seen.LoadOrStore(r.Header.Get("Idempotency-Key"), true); again {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"type":"api_error","message":"Something went wrong on Stripe's end."}}`)
	}))
	t.Cleanup(srv.Close)
	c, err := payment.New(payment.Config{APIKey: testKey, APIBase: srv.URL, HTTPClient: &http.Client{}})
	require.NoError(t, err)

	_, err = c.Deliver(t.Context(), delivery("k", createPI))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.False(t, connectors.IsPermanent(err), "the first 500 is retried: %v", err)
	require.Contains(t, err.Error(), "Stripe may have acted")

	_, err = c.Deliver(t.Context(), delivery("k", createPI))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.True(t, connectors.IsPermanent(err), "a replayed 500 is final: %v", err)
	require.Contains(t, err.Error(), "check the dashboard before replaying with a new key")
}

// A redirect is the answer, final, and nothing is sent again elsewhere.
func TestDeliver_RedirectNotFollowed(t *testing.T) {
	t.Parallel()
	var followed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/moved") {
			followed.Add(1)
			return
		}
		code := http.StatusTemporaryRedirect
		if r.Header.Get("Idempotency-Key") == "found" {
			code = http.StatusFound
		}
		http.Redirect(w, r, "/moved"+r.URL.Path, code)
	}))
	t.Cleanup(srv.Close)
	c, err := payment.New(payment.Config{APIKey: testKey, APIBase: srv.URL, HTTPClient: &http.Client{}})
	require.NoError(t, err)
	for _, key := range []string{"temporary", "found"} {
		_, err := c.Deliver(t.Context(), delivery(key, createPI))
		require.True(t, connectors.IsPermanent(err), "%s: %v", key, err)
		require.False(t, connectors.IsAmbiguous(err), "%s: %v", key, err)
	}
	require.Zero(t, followed.Load())
}

func TestDeliver_CancelledContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := b.c.Deliver(ctx, delivery("k", createPI))
	require.Error(t, err)
	require.False(t, connectors.IsPermanent(err))
	require.Empty(t, b.f.Requests("k"))
}

func TestNew_Validation(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name     string
		cfg      payment.Config
		contains []string
	}{
		{"NoKey", payment.Config{}, []string{"payment config: APIKey: required"}},
		{"BadScheme", payment.Config{APIKey: testKey, APIBase: "ftp://stripe.example"}, []string{`APIBase: scheme must be http or https, not "ftp"`}},
		{"NoHost", payment.Config{APIKey: testKey, APIBase: "http://"}, []string{"APIBase: has no host"}},
		{"Unparsable", payment.Config{APIKey: testKey, APIBase: "http://a b"}, []string{"APIBase: does not parse"}},
		{"Relative", payment.Config{APIKey: testKey, APIBase: "api.stripe.com"}, []string{"APIBase: scheme must be http or https"}},
		{"NegativeTimeout", payment.Config{APIKey: testKey, Timeout: -time.Second}, []string{"Timeout: -1s is negative"}},
		{"Several", payment.Config{APIBase: "ftp://x", Timeout: -time.Second}, []string{"APIKey: required", "APIBase:", "Timeout:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := payment.New(tc.cfg)
			require.Error(t, err)
			require.Nil(t, c)
			for _, s := range tc.contains {
				require.Contains(t, err.Error(), s)
			}
		})
	}

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		c, err := payment.New(payment.Config{APIKey: testKey})
		require.NoError(t, err)
		require.Equal(t, "payment https://api.stripe.com", c.String())
		require.Equal(t, connectors.Enforced, c.Guarantee())
	})
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	const secret = "sk_live_51SuperSecretValue"
	// The connector refuses credentials in the API base (TestNew_RefusesCredentialsInAPIBase);
	// a Config that holds them still never shows them.
	cfg := payment.Config{APIKey: secret, APIBase: "https://user:pw@stripe.example"}
	c, err := payment.New(payment.Config{APIKey: secret, APIBase: "https://stripe.example"})
	require.NoError(t, err)

	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	logger.Info("configured", "cfg", cfg, "connector", c)

	for _, s := range []string{
		fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg),
		fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), logs.String(),
	} {
		require.NotContains(t, s, "SuperSecret")
		require.NotContains(t, s, "pw@")
	}
	require.Contains(t, logs.String(), `"api_key":"sk_live_REDACTED"`)

	_, err = payment.New(payment.Config{APIKey: secret, APIBase: "ftp://x"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "SuperSecret")
}
