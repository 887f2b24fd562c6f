package payment

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/outboxd/outboxd/connectors"
)

// Config configures a [Connector]. A zero field means its default.
type Config struct {
	// APIKey is the Stripe secret (or restricted) key. Required. It is never printed:
	// [Config.String] and [Config.LogValue] redact it.
	APIKey string
	// APIBase is the Stripe API's base URL, an absolute http or https URL without white
	// space at either end, nor a user name or password (the API key authenticates);
	// request paths (/v1/...) are appended to any path of its own
	// (a proxy's prefix), less a final /v1 as stripe-go does. Tests point it at
	// stripe-mock. Defaults to https://api.stripe.com.
	APIBase string
	// HTTPClient sends the requests; it is copied, and the copy's transport is wrapped.
	// Defaults to a client on [DefaultTransport].
	HTTPClient *http.Client
	// Timeout bounds one attempt, from dialling to the end of the answer.
	// Defaults to 30s.
	Timeout time.Duration
}

// String describes cfg without the API key.
func (cfg Config) String() string {
	return fmt.Sprintf("payment.Config{APIKey: %s, APIBase: %s, Timeout: %s}",
		redactKey(cfg.APIKey), connectors.RedactURL(cfg.APIBase), cfg.Timeout)
}

// GoString keeps the API key out of %#v too.
func (cfg Config) GoString() string { return cfg.String() }

// LogValue keeps the API key out of logs.
func (cfg Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("api_key", redactKey(cfg.APIKey)),
		slog.String("api_base", connectors.RedactURL(cfg.APIBase)),
		slog.Duration("timeout", cfg.Timeout),
	)
}

const (
	// DefaultAPIBase is where [Config.APIBase] points when it is empty.
	DefaultAPIBase = stripe.APIURL
	defaultTimeout = 30 * time.Second
	// maxKeyLen is the longest idempotency key Stripe (and stripe-go) accepts.
	maxKeyLen = 255
)

// ErrTimeout is the cause of an attempt that ran past [Config.Timeout]; errors.Is finds
// it in the error Deliver returns.
var ErrTimeout = errors.New("payment attempt timed out")

// Connector performs Stripe API calls named by rows. It is safe for concurrent use.
type Connector struct {
	client  *stripe.Client
	apiKey  string // hidden in what answers repeat of it (see connectors.HideSecret)
	base    string // the API base as messages show it, without a password
	keyHint string // the redacted key
	timeout time.Duration
}

var _ connectors.Connector = (*Connector)(nil)

var sharedTransport = sync.OnceValue(func() *http.Transport {
	t := connectors.CloneDefaultTransport()
	t.MaxIdleConnsPerHost = 64
	t.IdleConnTimeout = 90 * time.Second
	return t
})

// DefaultTransport returns the keep-alive transport shared by every [Connector] built
// without a [Config.HTTPClient]: a clone of http.DefaultTransport (proxy settings from
// the environment, HTTP/2 when offered) that keeps up to 64 idle connections per host.
func DefaultTransport() *http.Transport { return sharedTransport() }

// New returns a connector for cfg, or an error naming the field that is wrong. The
// errors never quote the API key.
func New(cfg Config) (*Connector, error) {
	cfg = cfg.withDefaults()
	var errs []error
	if cfg.APIKey == "" {
		errs = append(errs, errors.New("APIKey: required"))
	} else if strings.TrimSpace(cfg.APIKey) != cfg.APIKey || strings.ContainsAny(cfg.APIKey, "\r\n\t ") {
		errs = append(errs, errors.New("APIKey: contains whitespace"))
	} else if !connectors.ValidHeaderValue(cfg.APIKey) {
		// It goes in the Authorization header, which net/http refuses to send: every
		// attempt would fail.
		errs = append(errs, errors.New("APIKey: has control characters"))
	}
	u, err := connectors.ParseAPIBase("APIBase", cfg.APIBase)
	if err != nil {
		errs = append(errs, err)
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout: %s is negative", cfg.Timeout))
	}
	for i, err := range errs {
		errs[i] = fmt.Errorf("payment config: %w", err) // one line per problem, each complete
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	hc := &http.Client{Transport: DefaultTransport()}
	if cfg.HTTPClient != nil {
		copied := *cfg.HTTPClient
		hc = &copied
	}
	// Redirects are not followed: a 302 would turn the POST into a GET whose answer
	// reads as an unknown outcome, and a 307 would send it again elsewhere within one
	// attempt. A redirect is the answer, and a configuration to fix.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	// stripe-go reads an answer only when its request's path begins with /v1: under a
	// base with a path of its own (a proxy's prefix) it would send the request and then
	// fail it unread. So stripe-go gets the origin, and the transport puts the base's
	// path back in front of each request's, without a final /v1, which stripe-go drops
	// from a base too (bases used to end in it).
	origin := &url.URL{Scheme: u.Scheme, User: u.User, Host: u.Host}
	rawPath := strings.TrimSuffix(strings.TrimRight(u.EscapedPath(), "/"), "/v1")
	path, _ := url.PathUnescape(rawPath) // it parsed: no error
	hc.Transport = &observingTransport{
		// stripe-go reads every answer's body, which for a 101 is the connection itself:
		// see connectors.NoProtocolSwitch.
		base:    connectors.NoProtocolSwitch(cmp.Or[http.RoundTripper](hc.Transport, http.DefaultTransport)),
		path:    path,
		rawPath: rawPath,
	}

	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:        stripe.String(origin.String()),
		HTTPClient: hc,
		// The relay owns retries: an attempt is one request, and the relay sees every
		// failure (stripe-go would otherwise retry 409s, 5xx and network errors itself).
		MaxNetworkRetries: stripe.Int64(0),
		// Libraries return errors and their callers log them; stripe-go logs errors to
		// stderr by default.
		LeveledLogger:   &stripe.LeveledLogger{Level: stripe.LevelNull},
		EnableTelemetry: stripe.Bool(false),
	})
	return &Connector{
		client:  stripe.NewClient(cfg.APIKey, stripe.WithBackends(&stripe.Backends{API: backend})),
		apiKey:  cfg.APIKey,
		base:    u.Redacted(),
		keyHint: redactKey(cfg.APIKey),
		timeout: cfg.Timeout,
	}, nil
}

func (cfg Config) withDefaults() Config {
	cfg.APIBase = cmp.Or(cfg.APIBase, DefaultAPIBase)
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	return cfg
}

// redactKey shows only what kind of key it is ("sk_test_…"), never the secret part.
func redactKey(key string) string {
	if key == "" {
		return ""
	}
	for _, prefix := range []string{"sk_test_", "sk_live_", "rk_test_", "rk_live_"} {
		if strings.HasPrefix(key, prefix) {
			return prefix + "REDACTED"
		}
	}
	return "REDACTED"
}

// String names the connector by its API base, and never shows the API key.
func (c *Connector) String() string { return "payment " + c.base }

// GoString is String: %#v would print the fields, the secrets among them.
func (c *Connector) GoString() string { return c.String() }

// LogValue keeps the API key out of logs.
func (c *Connector) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("api_base", c.base),
		slog.String("api_key", c.keyHint),
		slog.Duration("timeout", c.timeout),
		slog.String("guarantee", string(connectors.Enforced)),
	)
}

// Guarantee reports [connectors.Enforced]: Stripe dedupes on the idempotency key.
func (c *Connector) Guarantee() connectors.Guarantee { return connectors.Enforced }

// Timeout is the time limit of one attempt (see [connectors.Timeouter]).
func (c *Connector) Timeout() time.Duration { return c.timeout }

// payload is what a row holds.
type payload struct {
	Operation string          `json:"operation"`
	Params    json.RawMessage `json:"params"`
}

// Result is what Deliver returns for the relay to store after Stripe answered with an
// object. Fields Stripe did not send are left out.
type Result struct {
	Object string `json:"object"`
	ID     string `json:"id"`
	Status string `json:"status,omitempty"`
	// Livemode is a pointer so that it is left out for objects without one (a Refund):
	// false there would claim a live refund was a test.
	Livemode *bool  `json:"livemode,omitempty"`
	Amount   *int64 `json:"amount,omitempty"`
	Currency string `json:"currency,omitempty"`
	// Replayed is true when Stripe answered from its store of idempotent requests
	// (the Idempotent-Replayed header): an earlier attempt with this key did the work.
	Replayed bool `json:"idempotent_replayed,omitempty"`
}

// Decline is what Deliver returns for the relay to store after a card_error: the
// attempt happened, and Stripe replays the same decline for the same key.
type Decline struct {
	Object        string `json:"object"` // "error"
	Type          string `json:"type"`   // "card_error"
	Code          string `json:"code,omitempty"`
	DeclineCode   string `json:"decline_code,omitempty"`
	Message       string `json:"message,omitempty"`
	Param         string `json:"param,omitempty"`
	PaymentIntent string `json:"payment_intent,omitempty"`
	Charge        string `json:"charge,omitempty"`
	RequestID     string `json:"request_id,omitempty"`
}

// ErrorAnswer is what Deliver returns for the relay to store, with its error, when
// Stripe answered with an error object other than a card_error that is final for the key
// (a permanent failure or a 5xx): Stripe stores that answer against the key once the
// request began to run and replays it, so it is the key's outcome too.
type ErrorAnswer struct {
	Object    string `json:"object"` // "error"
	Status    int    `json:"status"`
	Type      string `json:"type"`
	Code      string `json:"code,omitempty"`
	Message   string `json:"message,omitempty"`
	Param     string `json:"param,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Replayed is true when Stripe answered from its store (Idempotent-Replayed).
	Replayed bool `json:"idempotent_replayed,omitempty"`
}

// operation performs one Stripe call with params (without "id") under key.
type operation struct {
	needsID bool
	// required are the params Stripe refuses the call without, on every attempt.
	required []string
	// newParams returns a new params struct of the call, for [CheckPayload].
	newParams func() any
	call      func(ctx context.Context, c *stripe.Client, id string, params json.RawMessage, key string) (*stripe.APIResponse, error)
}

// operations are the calls a row may name. Each decodes its params into stripe-go's
// params struct for the call, so a misspelt parameter is refused before anything is sent.
var operations = map[string]operation{
	"payment_intent.create": {required: []string{"amount", "currency"}, newParams: func() any { return &stripe.PaymentIntentCreateParams{} }, call: func(ctx context.Context, c *stripe.Client, _ string, raw json.RawMessage, key string) (*stripe.APIResponse, error) {
		p := &stripe.PaymentIntentCreateParams{}
		if err := decodeParams(raw, p); err != nil {
			return nil, err
		}
		p.SetIdempotencyKey(key)
		v, err := c.V1PaymentIntents.Create(ctx, p)
		return lastResponse(v, err)
	}},
	"payment_intent.confirm": {needsID: true, newParams: func() any { return &stripe.PaymentIntentConfirmParams{} }, call: func(ctx context.Context, c *stripe.Client, id string, raw json.RawMessage, key string) (*stripe.APIResponse, error) {
		p := &stripe.PaymentIntentConfirmParams{}
		if err := decodeParams(raw, p); err != nil {
			return nil, err
		}
		p.SetIdempotencyKey(key)
		v, err := c.V1PaymentIntents.Confirm(ctx, id, p)
		return lastResponse(v, err)
	}},
	"payment_intent.cancel": {needsID: true, newParams: func() any { return &stripe.PaymentIntentCancelParams{} }, call: func(ctx context.Context, c *stripe.Client, id string, raw json.RawMessage, key string) (*stripe.APIResponse, error) {
		p := &stripe.PaymentIntentCancelParams{}
		if err := decodeParams(raw, p); err != nil {
			return nil, err
		}
		p.SetIdempotencyKey(key)
		v, err := c.V1PaymentIntents.Cancel(ctx, id, p)
		return lastResponse(v, err)
	}},
	"refund.create": {newParams: func() any { return &stripe.RefundCreateParams{} }, call: func(ctx context.Context, c *stripe.Client, _ string, raw json.RawMessage, key string) (*stripe.APIResponse, error) {
		p := &stripe.RefundCreateParams{}
		if err := decodeParams(raw, p); err != nil {
			return nil, err
		}
		p.SetIdempotencyKey(key)
		v, err := c.V1Refunds.Create(ctx, p)
		return lastResponse(v, err)
	}},
	"customer.create": {newParams: func() any { return &stripe.CustomerCreateParams{} }, call: func(ctx context.Context, c *stripe.Client, _ string, raw json.RawMessage, key string) (*stripe.APIResponse, error) {
		p := &stripe.CustomerCreateParams{}
		if err := decodeParams(raw, p); err != nil {
			return nil, err
		}
		p.SetIdempotencyKey(key)
		v, err := c.V1Customers.Create(ctx, p)
		return lastResponse(v, err)
	}},
}

// Operations returns the operation names a payload may use, sorted.
func Operations() []string {
	names := make([]string, 0, len(operations))
	for name := range operations {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// resource is a stripe-go object an operation returns.
type resource interface {
	*stripe.PaymentIntent | *stripe.Refund | *stripe.Customer
}

// lastResponse returns the response a stripe-go resource was decoded from.
func lastResponse[R resource](v R, err error) (*stripe.APIResponse, error) {
	if err != nil {
		return nil, err
	}
	switch v := any(v).(type) {
	case *stripe.PaymentIntent:
		return v.LastResponse, nil
	case *stripe.Refund:
		return v.LastResponse, nil
	case *stripe.Customer:
		return v.LastResponse, nil
	}
	return nil, nil // unreachable: resource's type set is closed
}

// badParamsError marks a payload the connector refuses before sending anything.
type badParamsError struct{ err error }

func (e *badParamsError) Error() string { return e.err.Error() }
func (e *badParamsError) Unwrap() error { return e.err }

// Deliver performs the row's Stripe call once, with the row's key as the Stripe
// idempotency key. See the package documentation for the payload, the result and how
// failures are classified.
func (c *Connector) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	res, err := c.deliver(ctx, d)
	// An answer may repeat the request's Authorization header, the API key in it.
	return connectors.HideSecret(res, err, c.apiKey)
}

func (c *Connector) deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	if d.Key == "" {
		return nil, connectors.Permanent(errors.New("deliver payment: the row has no idempotency key"))
	}
	if len(d.Key) > maxKeyLen || strings.TrimSpace(d.Key) != d.Key || !connectors.ValidHeaderValue(d.Key) {
		return nil, connectors.Permanent(fmt.Errorf("deliver payment: the row's key is not a valid Stripe idempotency key (1-%d bytes, no surrounding whitespace, no control characters)", maxKeyLen))
	}
	var p payload
	if err := connectors.DecodeObject(d.Payload, &p); err != nil {
		return nil, connectors.Permanent(fmt.Errorf(`deliver payment: the payload is not {"operation": "...", "params": {...}}: %w`, err))
	}
	op, ok := operations[p.Operation]
	if !ok {
		return nil, connectors.Permanent(fmt.Errorf("deliver payment: unknown operation %q (want one of %s)", p.Operation, strings.Join(Operations(), ", ")))
	}
	what := fmt.Sprintf("%s at %s", p.Operation, c.base)
	params, id, err := op.splitParams(p.Params)
	if err != nil {
		return nil, connectors.Permanent(fmt.Errorf("%s: %w", what, err))
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: not sent: %w", what, context.Cause(ctx))
	}

	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, ErrTimeout)
	defer cancel()
	ex := &exchange{}
	ctx = context.WithValue(ctx, exchangeKey{}, ex)
	// Whether any of the request reached Stripe (see connectors.TraceSend): a failure
	// before that (a keep-alive connection reset before the flush, a refused TLS 1.3
	// handshake) sent nothing Stripe could act on, and is not ambiguous.
	ctx, ex.sent = connectors.TraceSend(ctx)

	resp, err := op.call(ctx, c.client, id, params, d.Key)
	if err != nil {
		return c.classify(ctx, what, ex, err)
	}
	return resultOf(what, resp)
}

// splitParams refuses params without one of the operation's required params (or with
// it null), takes "id" out of them when the operation needs it, and refuses it otherwise
// (the params struct would refuse it anyway, with a less helpful message).
func (op operation) splitParams(raw json.RawMessage) (json.RawMessage, string, error) {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		raw = json.RawMessage(`{}`)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, "", errors.New("params: must be a JSON object")
	}
	var id string
	if op.needsID {
		rawID, ok := fields["id"]
		if !ok {
			return nil, "", errors.New(`params: "id" is required`)
		}
		if err := json.Unmarshal(rawID, &id); err != nil || !validObjectID(id) {
			return nil, "", errors.New(`params: "id" must be a non-empty Stripe object id`)
		}
	}
	for _, name := range op.required {
		if v, ok := fields[name]; !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			return nil, "", fmt.Errorf("params: %q is required", name)
		}
	}
	if !op.needsID {
		return raw, "", nil
	}
	delete(fields, "id")
	rest, err := json.Marshal(fields)
	if err != nil {
		return nil, "", fmt.Errorf("params: %w", err)
	}
	return rest, id, nil
}

// validObjectID reports whether id can be a Stripe object id ("pi_3Mtw..."): letters,
// digits and '_' only, so that it stays one path segment of the operation's own endpoint
// ("." and ".." would be dot segments; control characters are in no id).
func validObjectID(id string) bool {
	if id == "" || len(id) > 255 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func init() { connectors.RegisterPayloadCheck("payment", CheckPayload) }

// CheckPayload reports, without sending anything, why the connector would refuse
// payload on every attempt (a payload that is not {"operation", "params"}, an unknown
// operation, a missing or malformed "id", params stripe-go's params struct does not
// take), or returns nil. It is registered for the payment kind (see
// [connectors.RegisterPayloadCheck]): outbox.Enqueue runs it in programs that import
// this package, such as outboxd, so that such a row is refused before it is written.
func CheckPayload(raw []byte) error {
	var p payload
	if err := connectors.DecodeObject(raw, &p); err != nil {
		return fmt.Errorf(`the payload is not {"operation": "...", "params": {...}}: %w`, err)
	}
	op, ok := operations[p.Operation]
	if !ok {
		return fmt.Errorf("unknown operation %q (want one of %s)", p.Operation, strings.Join(Operations(), ", "))
	}
	params, _, err := op.splitParams(p.Params)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Operation, err)
	}
	if err := decodeParams(params, op.newParams()); err != nil {
		return fmt.Errorf("%s: %w", p.Operation, err)
	}
	return nil
}

// resultOf turns Stripe's 2xx answer into the stored result.
func resultOf(what string, resp *stripe.APIResponse) (json.RawMessage, error) {
	if resp == nil {
		return nil, connectors.Ambiguous(fmt.Errorf("%s: Stripe answered but the answer was not recorded; it may have acted", what))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// stripe-go reads any answer below 400 as the object it asked for, so a redirect
		// with a JSON body (an API gateway's {"message": ...}) comes back as a success.
		// It is not one: the redirect is not followed, and is final (see classifyStatus).
		return nil, classifyStatus(what, resp.StatusCode, resp.Header,
			errors.New(connectors.Excerpt(string(resp.RawJSON), maxErrorExcerpt)), false)
	}
	var r Result
	if err := json.Unmarshal(resp.RawJSON, &r); err != nil || r.Object == "" || r.ID == "" {
		return nil, connectors.Ambiguous(fmt.Errorf("%s: Stripe answered %s without an object and id; it may have acted", what, resp.Status))
	}
	r.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	return connectors.MarshalResult(r), nil
}

// classify turns a failed call into a stored result (a decline) or a classified error.
func (c *Connector) classify(ctx context.Context, what string, ex *exchange, err error) (json.RawMessage, error) {
	if bp, ok := errors.AsType[*badParamsError](err); ok {
		return nil, connectors.Permanent(fmt.Errorf("%s: %w", what, bp.err))
	}
	status, header := ex.answer()
	if se, ok := errors.AsType[*stripe.Error](err); ok {
		if se.HTTPStatusCode != 0 {
			status = se.HTTPStatusCode
		}
		if se.LastResponse != nil && se.LastResponse.Header != nil {
			header = se.LastResponse.Header
		}
		return classifyStripe(what, status, header, se)
	}
	if status != 0 {
		// An answer that is not a Stripe error object: a proxy's page, a 2xx body
		// stripe-go could not decode, or an answer the attempt's time limit cut short.
		detail := errors.New(connectors.Excerpt(err.Error(), maxErrorExcerpt))
		timedOut := errors.Is(context.Cause(ctx), ErrTimeout) && (errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded))
		if timedOut {
			// ErrTimeout's doc: errors.Is finds it in the error Deliver returns.
			detail = fmt.Errorf("the rest of the answer did not come within %s: %w", c.timeout, ErrTimeout)
		}
		if ex.bodyLost.Load() && status >= 400 && status <= 499 {
			// A 4xx whose body was lost on the way is not yet Stripe's answer: the status
			// alone does not tell a card decline (the key's outcome, to store) from a
			// refused request, and what to fix is in the body. A retry with the same key
			// brings the whole answer: Stripe replays one it saved, and checks again a
			// request it saved nothing for. stripe-go, whose own retries are off, retries
			// such a read error whatever the status.
			if !timedOut {
				detail = fmt.Errorf("the connection dropped before the rest of the answer came: %w", detail)
			}
			lost := retryable(fmt.Errorf("%s: Stripe answered %s, but %w; a retry with the same key gets the whole answer",
				what, connectors.StatusText(status), detail), header)
			if status == http.StatusConflict {
				// The status line says as much as a whole 409 does (see classifyStripe):
				// an earlier request with the key is still running and may act.
				lost = connectors.Ambiguous(lost)
			}
			return nil, lost
		}
		return nil, classifyStatus(what, status, header, detail, status >= 200 && status <= 299)
	}

	// No answer at all.
	cause := err
	if ue, ok := errors.AsType[*url.Error](err); ok {
		cause = ue.Err // it repeats the method and URL
	}
	timedOut := errors.Is(context.Cause(ctx), ErrTimeout)
	if timedOut && !errors.Is(cause, ErrTimeout) {
		cause = fmt.Errorf("%w: %w", ErrTimeout, cause)
	}
	sent := ex.sent(err)
	switch {
	case sent && timedOut:
		return nil, connectors.Ambiguous(fmt.Errorf("%s: no answer within %s; Stripe may have acted: %w", what, c.timeout, cause))
	case sent && ctx.Err() != nil:
		return nil, connectors.Ambiguous(fmt.Errorf("%s: attempt cancelled while in flight; Stripe may have acted: %w", what, cause))
	case sent:
		return nil, connectors.Ambiguous(fmt.Errorf("%s: connection failed while the request was in flight; Stripe may have acted: %w", what, cause))
	case timedOut:
		return nil, fmt.Errorf("%s: the request could not be sent within %s: %w", what, c.timeout, cause)
	default:
		return nil, fmt.Errorf("%s: the request could not be sent: %w", what, cause)
	}
}

// classifyStripe classifies an answer that carried a Stripe error object.
func classifyStripe(what string, status int, header http.Header, se *stripe.Error) (json.RawMessage, error) {
	msg := se.Msg
	if se.Code != "" {
		msg = fmt.Sprintf("%s (%s)", msg, se.Code)
	}
	answered := fmt.Sprintf("%s: Stripe answered %s %s: %s", what, connectors.StatusText(status), se.Type, msg)
	// Stored with the error when it is Stripe's answer for the key, which it replays: not
	// for a 409 or an answer to retry, for which Stripe saved nothing (the request did
	// not begin to run), and which the relay would otherwise keep through later attempts
	// that bring no answer.
	stored := connectors.MarshalResult(ErrorAnswer{
		Object: "error", Status: status, Type: string(se.Type), Code: string(se.Code), Message: se.Msg,
		Param: se.Param, RequestID: se.RequestID, Replayed: header.Get("Idempotent-Replayed") == "true",
	})
	switch {
	case status == http.StatusConflict && header.Get("Stripe-Should-Retry") != "false":
		// A concurrent request with the same key is still running (Stripe sends this as
		// an idempotency_error, but it is not a key reused with other parameters). It
		// is an earlier attempt whose answer was lost, which may yet act: this attempt
		// leaves the key's outcome as unknown as that one did, so it is ambiguous too.
		// The row's mark tells of its latest attempt only, and a row whose attempts
		// ran out on 409s would otherwise end dead as if Stripe had not acted.
		return nil, connectors.Ambiguous(retryable(fmt.Errorf(
			"%s (an earlier request with this key is still running at Stripe and may act; a retry with the same key gets its answer)", answered), header))
	case se.Type == stripe.ErrorTypeCard:
		// The attempt happened and has a final outcome; Stripe replays the same decline
		// for the same key, so it is the stored answer rather than a failure.
		d := Decline{
			Object:      "error",
			Type:        string(se.Type),
			Code:        string(se.Code),
			DeclineCode: string(se.DeclineCode),
			Message:     se.Msg,
			Param:       se.Param,
			Charge:      se.ChargeID,
			RequestID:   se.RequestID,
		}
		if se.PaymentIntent != nil {
			d.PaymentIntent = se.PaymentIntent.ID
		}
		return connectors.MarshalResult(d), nil
	case header.Get("Stripe-Should-Retry") == "false" && (status >= 500 || se.Type == stripe.ErrorTypeAPI):
		// Stripe says a retry would be a no-op (it would replay this answer): final, and
		// Stripe may have acted, as for a replayed 5xx.
		return stored, connectors.Ambiguous(connectors.Permanent(fmt.Errorf(
			"%s (Stripe-Should-Retry: false; it may have acted: check the dashboard before replaying with a new key)", answered)))
	case header.Get("Stripe-Should-Retry") == "false":
		return stored, connectors.Permanent(fmt.Errorf("%s (Stripe-Should-Retry: false)", answered))
	case se.Type == stripe.ErrorTypeIdempotency:
		// The key was used before with different parameters: no retry can fix that.
		return stored, connectors.Permanent(errors.New(answered))
	case (status >= 500 || se.Type == stripe.ErrorTypeAPI) && header.Get("Stripe-Should-Retry") == "true":
		// Stripe says a retry can still do the work, so it saved no answer for the key:
		// not stored, as for a 409. Its outcome is as unknown as any 5xx's.
		return nil, serverError(errors.New(answered), header)
	case status >= 500 || se.Type == stripe.ErrorTypeAPI:
		return stored, serverError(errors.New(answered), header)
	case connectors.RetryableStatus(status), header.Get("Stripe-Should-Retry") == "true":
		return nil, retryable(errors.New(answered), header)
	default: // invalid_request_error, authentication and permission errors, other 4xx
		return stored, connectors.Permanent(errors.New(answered))
	}
}

// classifyStatus classifies an answer without a Stripe error object.
func classifyStatus(what string, status int, header http.Header, detail error, success bool) error {
	if success {
		return connectors.Ambiguous(fmt.Errorf("%s: Stripe answered %s but the answer could not be read; it may have acted: %w",
			what, connectors.StatusText(status), detail))
	}
	err := fmt.Errorf("%s: answered %s: %w", what, connectors.StatusText(status), detail)
	if status >= 500 {
		return serverError(err, header)
	}
	if connectors.RetryableStatus(status) {
		return retryable(err, header)
	}
	return connectors.Permanent(err)
}

// serverError classifies a 5xx answer. Stripe's outcome is then unknown (it may have
// acted before it failed), so the attempt is ambiguous. Stripe saves a 500 against the
// key once the request began to run, and answers every retry with it (marked
// Idempotent-Replayed): such a replay is final, and retrying cannot learn more.
func serverError(err error, header http.Header) error {
	if header.Get("Idempotent-Replayed") == "true" {
		return connectors.Ambiguous(connectors.Permanent(fmt.Errorf(
			"%w (Stripe answers this key with the same error every time, so a retry cannot change it; "+
				"it may have acted: check the dashboard before replaying with a new key)", err)))
	}
	return connectors.Ambiguous(retryable(fmt.Errorf("%w (Stripe may have acted)", err), header))
}

func retryable(err error, header http.Header) error {
	if d, ok := connectors.RetryAfterOf(header, time.Now()); ok {
		return connectors.RetryAfter(err, d)
	}
	return err
}

const maxErrorExcerpt = 200

// exchange records what the transport saw of one attempt, for classification: whether
// any of the request may have reached Stripe, the answer's status and headers when one came (a
// non-Stripe error body loses them inside stripe-go), and whether reading its body
// failed (stripe-go returns the bare read error).
type exchange struct {
	sent     func(err error) bool // from connectors.TraceSend
	bodyLost atomic.Bool
	mu       sync.Mutex
	status   int
	header   http.Header
}

func (e *exchange) answer() (int, http.Header) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.status, e.header
}

type exchangeKey struct{}

// observingTransport records each answer into the attempt's exchange, stops net/http
// from resending a request by itself, and puts the API base's path (path, rawPath: its
// escaped form; both without a trailing slash) in front of the request's.
type observingTransport struct {
	base          http.RoundTripper
	path, rawPath string
}

func (t *observingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// stripe-go sets GetBody, and its requests carry Idempotency-Key, which together
	// make net/http resend a POST on its own when a reused connection dies after the
	// request was written. The relay owns retries and must see that attempt fail.
	if req.GetBody != nil || t.path != "" {
		req = req.Clone(req.Context())
		req.GetBody = nil
		if t.path != "" {
			req.URL.RawPath = t.rawPath + req.URL.EscapedPath()
			req.URL.Path = t.path + req.URL.Path
		}
	}
	resp, err := t.base.RoundTrip(req)
	if resp != nil {
		if ex, ok := req.Context().Value(exchangeKey{}).(*exchange); ok {
			ex.mu.Lock()
			ex.status, ex.header = resp.StatusCode, resp.Header
			ex.mu.Unlock()
			resp.Body = &observedBody{ReadCloser: resp.Body, ex: ex, left: maxAnswerBytes}
		}
	}
	return resp, err
}

// maxAnswerBytes bounds how much of an answer is read. stripe-go reads every answer
// whole, with no bound of its own: an answer without end (a proxy streaming a file) held
// all an attempt could read within its time limit, at up to the relay's concurrency at
// once. Stripe's answers to the operations here are single objects, far smaller.
const maxAnswerBytes = 1 << 20

// errAnswerTooLarge ends the reading of an answer longer than maxAnswerBytes.
var errAnswerTooLarge = fmt.Errorf("the answer is longer than %d MiB, and was not read further", maxAnswerBytes>>20)

// observedBody is an answer's body that records in its exchange a read that failed
// before the end: the connection dropped, or the attempt's time limit struck. It reads
// no more than left bytes more, and fails with errAnswerTooLarge when there are.
type observedBody struct {
	io.ReadCloser
	ex   *exchange
	left int64
}

func (b *observedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// All that is read of an answer is in: is there more?
		var one [1]byte
		n, err := b.ReadCloser.Read(one[:])
		if n > 0 {
			return 0, errAnswerTooLarge
		}
		if err != nil && err != io.EOF {
			b.ex.bodyLost.Store(true)
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if err != nil && err != io.EOF {
		b.ex.bodyLost.Store(true)
	}
	return n, err
}

// CloseIdleConnections closes the idle connections of the transport underneath.
func (t *observingTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// StripeKeyWindow is how long Stripe remembers an idempotency key: "keys are eligible to
// be removed from the system automatically after they're at least 24 hours old".
const StripeKeyWindow = 24 * time.Hour

// KeyWindow says that Stripe forgets idempotency keys after 24 hours, so the relay never
// retries a payment later than that after its first attempt (see
// [connectors.KeyWindower]).
func (c *Connector) KeyWindow() time.Duration { return StripeKeyWindow }
