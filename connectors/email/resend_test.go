package email_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/email"
)

func newResend(t *testing.T, f *fakeResend) *email.Resend {
	t.Helper()
	c, err := email.NewResend(email.ResendConfig{APIKey: f.apiKey, APIBase: f.URL(), From: testFrom})
	require.NoError(t, err)
	return c
}

func decodeResendResult(t *testing.T, raw json.RawMessage) email.ResendResult {
	t.Helper()
	var res email.ResendResult
	require.NoError(t, json.Unmarshal(raw, &res), "result %s", raw)
	return res
}

func TestResendConformance(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	require.Equal(t, connectors.Enforced, c.Guarantee())
	connectortest.Run(t, connectortest.Harness{
		Connector: c,
		PayloadFunc: func(i int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"to":"user%d@example.com","subject":"row %d","text":"hello %d"}`, i, i, i))
		},
		EffectsFunc:         f.Effects,
		RequestsFunc:        f.RequestsFor,
		DropAfterEffectFunc: f.DropAfterEffect,
	})
}

func TestResendKeyWindow(t *testing.T) {
	t.Parallel()
	c, err := email.NewResend(email.ResendConfig{APIKey: "re_x", From: testFrom})
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, connectors.KeyWindow(c))
	require.Equal(t, email.ResendKeyWindow, c.KeyWindow())
	require.Equal(t, connectors.Enforced, c.Guarantee())
	require.Equal(t, "email resend https://api.resend.com/emails from orders@shop.example", c.String())
}

func TestResendDeliver_Request(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	raw, err := c.Deliver(t.Context(), delivery("order:1/shipped", `{
		"to": ["Ann <ann@example.com>", "bob@example.com"],
		"cc": "carl@example.com",
		"bcc": ["audit@example.com"],
		"reply_to": "support@example.com",
		"subject": "Shipped",
		"text": "plain",
		"html": "<p>html & more</p>",
		"headers": {"x-tenant": "acme"}
	}`))
	require.NoError(t, err)
	res := decodeResendResult(t, raw)
	require.NotEmpty(t, res.ID)
	require.Equal(t, http.StatusOK, res.Status)
	require.Equal(t, 1, f.Effects("order:1/shipped"))

	reqs := f.Requests()
	require.Len(t, reqs, 1)
	r := reqs[0]
	require.Equal(t, "Bearer "+f.apiKey, r.Header.Get("Authorization"))
	require.Equal(t, "order:1/shipped", r.Header.Get("Idempotency-Key"))
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	require.Empty(t, r.Header.Get("Traceparent"), "the row's headers are not the API's")
	require.Equal(t, map[string]any{
		"from":     testFrom,
		"to":       []any{"Ann <ann@example.com>", "bob@example.com"},
		"cc":       []any{"carl@example.com"},
		"bcc":      []any{"audit@example.com"},
		"reply_to": []any{"support@example.com"},
		"subject":  "Shipped",
		"text":     "plain",
		"html":     "<p>html & more</p>",
		"headers":  map[string]any{"X-Tenant": "acme", "Idempotency-Key": "order:1/shipped"},
	}, r.Body)

	// A retry of a delivered key gets the stored answer and sends nothing.
	again, err := c.Deliver(t.Context(), delivery("order:1/shipped", `{
		"to": ["Ann <ann@example.com>", "bob@example.com"], "cc": "carl@example.com",
		"bcc": ["audit@example.com"], "reply_to": "support@example.com", "subject": "Shipped",
		"text": "plain", "html": "<p>html & more</p>", "headers": {"x-tenant": "acme"}}`))
	require.NoError(t, err)
	require.Equal(t, res.ID, decodeResendResult(t, again).ID)
	require.Equal(t, 1, f.Effects("order:1/shipped"))
}

func TestResendDeliver_Classification(t *testing.T) {
	t.Parallel()
	const payload = `{"to":"a@example.com","subject":"s","text":"t"}`
	tests := []struct {
		name      string
		status    int
		header    map[string]string
		body      string
		permanent bool
		delay     time.Duration // > 0: RetryAfter expected
		contains  string
	}{
		{"RateLimitedWithRetryAfter", 429, map[string]string{"Retry-After": "7"},
			`{"statusCode":429,"name":"rate_limit_exceeded","message":"Too many requests."}`, false, 7 * time.Second, "rate_limit_exceeded"},
		{"RateLimitedWithoutRetryAfter", 429, nil,
			`{"statusCode":429,"name":"rate_limit_exceeded","message":"Too many requests."}`, false, 0, "429"},
		{"ServerError", 500, nil,
			`{"statusCode":500,"name":"application_error","message":"An unexpected error occurred."}`, false, 0, "application_error"},
		{"Unavailable", 503, map[string]string{"Retry-After": "2"}, `oops`, false, 2 * time.Second, "oops"},
		{"ConcurrentKey", 409, nil,
			`{"statusCode":409,"name":"concurrent_idempotent_requests","message":"Try the request again later."}`, false, 0, "concurrent_idempotent_requests"},
		{"KeyReused", 409, nil,
			`{"statusCode":409,"name":"invalid_idempotent_request","message":"Same idempotency key used with a different request payload."}`, true, 0, "different request payload"},
		{"TooEarly", 425, nil, `{"statusCode":425,"name":"too_early","message":"Try again."}`, false, 0, "too_early"},
		{"Validation", 422, nil,
			`{"statusCode":422,"name":"validation_error","message":"Invalid ` + "`to`" + ` field."}`, true, 0, "Invalid `to` field."},
		{"BadRequest", 400, nil,
			`{"statusCode":400,"name":"invalid_idempotency_key","message":"The key must be between 1-256 chars."}`, true, 0, "invalid_idempotency_key"},
		{"Unauthorized", 401, nil, `{"statusCode":401,"name":"missing_api_key","message":"Missing API key."}`, true, 0, "missing_api_key"},
		{"Forbidden", 403, nil, `{"statusCode":403,"name":"invalid_api_key","message":"API key is invalid."}`, true, 0, "API key is invalid."},
		{"Redirect", 302, map[string]string{"Location": "http://127.0.0.1:1/elsewhere"}, ``, true, 0, "302"},
	}
	f := startFakeResend(t)
	c := newResend(t, f)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key := "classify:" + tt.name
			f.Script(key, tt.status, tt.header, tt.body)
			raw, err := c.Deliver(t.Context(), delivery(key, payload))
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.contains)
			require.NotContains(t, err.Error(), f.apiKey)
			require.Equal(t, tt.permanent, connectors.IsPermanent(err), "%v", err)
			// An answer is not ambiguous, except one saying that an earlier request with the
			// key is still in progress (TestResendDeliver_ConcurrentRequestIsAmbiguous) or
			// sent an email (TestResendDeliver_KeyUsedForAnotherBodyIsAmbiguous).
			require.Equal(t, tt.name == "ConcurrentKey" || tt.name == "KeyReused", connectors.IsAmbiguous(err), "%v", err)
			d, ok := connectors.RetryDelay(err)
			require.Equal(t, tt.delay > 0, ok, "%v", err)
			require.Equal(t, tt.delay, d)
			require.Equal(t, tt.status, decodeResendResult(t, raw).Status, "the answer is stored: %s", raw)
			require.Equal(t, 0, f.Effects(key))

			if !tt.permanent {
				// The retry with the same key goes through.
				res, err := c.Deliver(t.Context(), delivery(key, payload))
				require.NoError(t, err)
				require.NotEmpty(t, decodeResendResult(t, res).ID)
				require.Equal(t, 1, f.Effects(key))
			}
		})
	}
}

func TestResendDeliver_KeyReusedForAnotherEmail(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	_, err := c.Deliver(t.Context(), delivery("reused", `{"to":"a@example.com","subject":"s","text":"one"}`))
	require.NoError(t, err)
	raw, err := c.Deliver(t.Context(), delivery("reused", `{"to":"a@example.com","subject":"s","text":"two"}`))
	require.Error(t, err)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "invalid_idempotent_request")
	require.Equal(t, email.ResendResult{Status: 409, Name: "invalid_idempotent_request",
		Message: "Same idempotency key used with a different request payload. Change your idempotency key or payload."},
		decodeResendResult(t, raw))
	require.Equal(t, 1, f.Effects("reused"))
}

func TestResendDeliver_WrongKey(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	const wrong = "re_wrong_key_do_not_leak"
	c, err := email.NewResend(email.ResendConfig{APIKey: wrong, APIBase: f.URL(), From: testFrom})
	require.NoError(t, err)
	_, err = c.Deliver(t.Context(), delivery("k", `{"to":"a@example.com","subject":"s","text":"t"}`))
	require.Error(t, err)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "403")
	require.NotContains(t, err.Error(), wrong)
	require.Equal(t, 0, f.Effects("k"))
}

func TestResendDeliver_DropAfterSend(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	const payload = `{"to":"a@example.com","subject":"s","text":"t"}`
	// Warm a keep-alive connection first: a drop on a reused connection is where net/http
	// would resend a POST by itself if the connector let it.
	_, err := c.Deliver(t.Context(), delivery("warm", payload))
	require.NoError(t, err)

	f.DropAfterEffect("dropped")
	_, err = c.Deliver(t.Context(), delivery("dropped", payload))
	require.Error(t, err)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.Equal(t, 1, f.Effects("dropped"))
	require.Len(t, f.Requests(), 2, "net/http did not resend the request by itself")

	// The relay's retry: the next attempt, after an ambiguous one.
	retry := delivery("dropped", payload)
	retry.Attempt, retry.PreviousAmbiguous = 2, true
	res, err := c.Deliver(t.Context(), retry)
	require.NoError(t, err)
	require.NotEmpty(t, decodeResendResult(t, res).ID)
	require.Equal(t, 1, f.Effects("dropped"), "Resend returned the stored answer")
	require.Equal(t, 2, f.RequestsFor("dropped"), "the retry carried the first attempt's Idempotency-Key")
}

func TestResendDeliver_CancelledAndUnreachable(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := c.Deliver(ctx, delivery("cancelled", `{"to":"a@example.com","subject":"s","text":"t"}`))
	require.Error(t, err)
	require.False(t, connectors.IsPermanent(err))
	require.False(t, connectors.IsAmbiguous(err), "nothing was written: %v", err)

	down, err := email.NewResend(email.ResendConfig{APIKey: "re_x", APIBase: "http://" + refusedAddr(t), From: testFrom})
	require.NoError(t, err)
	_, err = down.Deliver(t.Context(), delivery("down", `{"to":"a@example.com","subject":"s","text":"t"}`))
	require.Error(t, err)
	require.False(t, connectors.IsPermanent(err))
	require.False(t, connectors.IsAmbiguous(err), "nothing was written: %v", err)
}

func TestResendDeliver_BadRow(t *testing.T) {
	t.Parallel()
	f := startFakeResend(t)
	c := newResend(t, f)
	for name, d := range map[string]connectors.Delivery{
		"NoKey":          delivery("", `{"to":"a@example.com","text":"t"}`),
		"LongKey":        delivery(strings.Repeat("k", 257), `{"to":"a@example.com","text":"t"}`),
		"ControlInKey":   delivery("a\nb", `{"to":"a@example.com","subject":"s","text":"t"}`),
		"SpaceAroundKey": delivery(" k", `{"to":"a@example.com","subject":"s","text":"t"}`),
		"UnknownField":   delivery("k", `{"to":"a@example.com","body":"t"}`),
		"NoTo":           delivery("k", `{"text":"t"}`),
		"NoBody":         delivery("k", `{"to":"a@example.com"}`),
		"BadAddress":     delivery("k", `{"to":"not an address","text":"t"}`),
		"ReservedHeader": delivery("k", `{"to":"a@example.com","text":"t","headers":{"idempotency-key":"x"}}`),
	} {
		t.Run(name, func(t *testing.T) { // not parallel: the check below runs after them
			_, err := c.Deliver(t.Context(), d)
			require.Error(t, err)
			require.True(t, connectors.IsPermanent(err), "%v", err)
		})
	}
	require.Empty(t, f.Requests(), "refused before sending")
}

func TestNewResend(t *testing.T) {
	t.Parallel()
	const key = "re_very_secret_key"
	tests := []struct {
		name string
		cfg  email.ResendConfig
		want []string
	}{
		{"Empty", email.ResendConfig{}, []string{"APIKey: required", "From: required"}},
		{"KeyWithNewline", email.ResendConfig{APIKey: key + "\n", From: testFrom}, []string{"APIKey:", "spaces or newlines"}},
		{"BadBase", email.ResendConfig{APIKey: key, From: testFrom, APIBase: "ftp://x"}, []string{"APIBase:"}},
		{"RelativeBase", email.ResendConfig{APIKey: key, From: testFrom, APIBase: "/api"}, []string{"APIBase:"}},
		{"BadFrom", email.ResendConfig{APIKey: key, From: "nobody"}, []string{"From:", "not an email address"}},
		{"NegativeTimeout", email.ResendConfig{APIKey: key, From: testFrom, Timeout: -time.Second}, []string{"Timeout:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := email.NewResend(tt.cfg)
			require.Error(t, err)
			require.Nil(t, c)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), key)
			for _, line := range strings.Split(err.Error(), "\n") {
				require.True(t, strings.HasPrefix(line, "email resend config: "), "%q", line)
			}
		})
	}

	c, err := email.NewResend(email.ResendConfig{APIKey: key, APIBase: "http://127.0.0.1:9/v1/", From: testFrom})
	require.NoError(t, err)
	require.Equal(t, "email resend http://127.0.0.1:9/v1/emails from orders@shop.example", c.String())
}

func TestResendRedaction(t *testing.T) {
	t.Parallel()
	const key = "re_very_secret_key"
	cfg := email.ResendConfig{APIKey: key, From: testFrom}
	c, err := email.NewResend(cfg)
	require.NoError(t, err)

	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("configured", "config", cfg, "connector", c)
	out := buf.String()
	require.NotContains(t, out, key)
	require.Contains(t, out, "REDACTED")
	require.Contains(t, out, "api.resend.com")
	for _, s := range []string{
		fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg),
		fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%v", &cfg),
		fmt.Sprintf("%#v", c), // the connector holds the secret too
	} {
		require.NotContains(t, s, key)
	}
}
