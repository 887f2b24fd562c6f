package email

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
	"net/mail"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outboxd/connectors"
)

const (
	// DefaultResendAPIBase is the Resend API's base URL, the default of
	// [ResendConfig.APIBase].
	DefaultResendAPIBase = "https://api.resend.com"
	// ResendKeyWindow is how long Resend remembers an Idempotency-Key: 24 hours. It is
	// the [Resend] connector's [connectors.KeyWindower] window.
	ResendKeyWindow = 24 * time.Hour
	// maxResendKey is the longest Idempotency-Key Resend accepts.
	maxResendKey = 256
	// maxResendAnswer bounds how much of an answer is read.
	maxResendAnswer = 64 << 10
	// maxResendMessage bounds Resend's error message as quoted in an error.
	maxResendMessage = 300
)

// ResendConfig configures a [Resend] connector. A zero field means its default.
type ResendConfig struct {
	// APIKey is the Resend API key, "re_...". Required. It never appears in logs or
	// errors.
	APIKey string
	// APIBase is the API's base URL; emails are POSTed to APIBase + "/emails". Another
	// value points at a proxy or a fake. It takes no user name or password: the API key
	// authenticates. Defaults to [DefaultResendAPIBase].
	APIBase string
	// From is the sender, such as "Shop <orders@shop.example>", on a domain verified
	// with Resend. Required.
	From string
	// HTTPClient sends the requests; it is copied, and the copy never follows
	// redirects. Defaults to a client on a clone of http.DefaultTransport.
	HTTPClient *http.Client
	// Timeout bounds one attempt, from dialling to the end of the answer. Defaults to
	// 30s.
	Timeout time.Duration
}

// String describes cfg without its API key, so that printing a ResendConfig with %v or
// %+v cannot leak it.
func (cfg ResendConfig) String() string {
	return fmt.Sprintf("email.ResendConfig{APIKey:%s APIBase:%q From:%q Timeout:%s}",
		redacted(cfg.APIKey), connectors.RedactURL(cfg.APIBase), cfg.From, cfg.Timeout)
}

// GoString is String, for %#v.
func (cfg ResendConfig) GoString() string { return cfg.String() }

// LogValue keeps the API key out of logs.
func (cfg ResendConfig) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("api_key", redacted(cfg.APIKey)),
		slog.String("api_base", connectors.RedactURL(cfg.APIBase)),
		slog.String("from", cfg.From),
		slog.Duration("timeout", cfg.Timeout),
	)
}

// ErrResendTimeout is the cause of a Resend attempt that ran past
// [ResendConfig.Timeout]; errors.Is finds it in the error Deliver returns.
var ErrResendTimeout = errors.New("resend attempt timed out")

// Resend sends rows as email through Resend's HTTP API (POST /emails), with the row's
// key as Resend's Idempotency-Key. Resend dedupes on that key for 24 hours, so the
// guarantee is [connectors.Enforced] and the key window [ResendKeyWindow]. It is safe
// for concurrent use.
type Resend struct {
	apiKey   string
	endpoint string // APIBase + "/emails"
	target   string // the endpoint as errors show it
	from     string
	fromAddr string
	timeout  time.Duration
	client   *http.Client
}

var (
	_ connectors.Connector   = (*Resend)(nil)
	_ connectors.KeyWindower = (*Resend)(nil)
)

var resendTransport = sync.OnceValue(func() *http.Transport {
	return connectors.CloneDefaultTransport()
})

// NewResend returns a Resend connector for cfg, or an error naming each field that is
// wrong. The errors never quote the API key.
func NewResend(cfg ResendConfig) (*Resend, error) {
	cfg.APIBase = cmp.Or(cfg.APIBase, DefaultResendAPIBase)
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	c := &Resend{apiKey: cfg.APIKey, timeout: cfg.Timeout, from: strings.TrimSpace(cfg.From)}
	var errs []error
	switch {
	case cfg.APIKey == "":
		errs = append(errs, errors.New("APIKey: required"))
	case strings.ContainsAny(cfg.APIKey, " \t\r\n"):
		errs = append(errs, errors.New("APIKey: must not contain spaces or newlines"))
	case !connectors.ValidHeaderValue(cfg.APIKey):
		errs = append(errs, errors.New("APIKey: has control characters"))
	}
	if base, err := connectors.ParseAPIBase("APIBase", cfg.APIBase); err != nil {
		errs = append(errs, err)
	} else {
		c.endpoint = strings.TrimRight(base.String(), "/") + "/emails"
		base.User = nil
		base.RawQuery, base.Fragment = "", ""
		c.target = strings.TrimRight(base.String(), "/") + "/emails"
	}
	if c.from == "" {
		errs = append(errs, errors.New("From: required"))
	} else if a, err := mail.ParseAddress(c.from); err != nil {
		errs = append(errs, fmt.Errorf("From: %q is not an email address: %w", cfg.From, err))
	} else {
		c.fromAddr = a.Address
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout: %s is negative", cfg.Timeout))
	}
	for i, err := range errs {
		errs[i] = fmt.Errorf("email resend config: %w", err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	client := &http.Client{Transport: resendTransport()}
	if cfg.HTTPClient != nil {
		copied := *cfg.HTTPClient
		client = &copied
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	// Deliver reads every answer's body, which for a 101 is the connection itself: see
	// connectors.NoProtocolSwitch.
	client.Transport = connectors.NoProtocolSwitch(cmp.Or[http.RoundTripper](client.Transport, http.DefaultTransport))
	c.client = client
	return c, nil
}

// String names the connector by its endpoint and sender, and never shows the key.
func (c *Resend) String() string { return "email resend " + c.target + " from " + c.fromAddr }

// GoString is String, for %#v, which would otherwise print the fields, API key included.
func (c *Resend) GoString() string { return c.String() }

// LogValue keeps the API key out of logs.
func (c *Resend) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("endpoint", c.target),
		slog.String("api_key", redacted(c.apiKey)),
		slog.String("from", c.fromAddr),
		slog.Duration("timeout", c.timeout),
	)
}

// Guarantee reports [connectors.Enforced]: Resend returns the stored answer for a
// repeated Idempotency-Key and sends nothing the second time.
func (c *Resend) Guarantee() connectors.Guarantee { return connectors.Enforced }

// KeyWindow reports [ResendKeyWindow]: Resend remembers a key for 24 hours.
func (c *Resend) KeyWindow() time.Duration { return ResendKeyWindow }

// Timeout is the time limit of one attempt (see [connectors.Timeouter]).
func (c *Resend) Timeout() time.Duration { return c.timeout }

// resendEmail is the body of POST /emails.
type resendEmail struct {
	From    string            `json:"from"`
	To      []string          `json:"to"`
	Cc      []string          `json:"cc,omitempty"`
	Bcc     []string          `json:"bcc,omitempty"`
	ReplyTo []string          `json:"reply_to,omitempty"`
	Subject string            `json:"subject"`
	Text    string            `json:"text,omitempty"`
	HTML    string            `json:"html,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// resendAnswer is what Resend answers: {"id": ...} on success, {"statusCode",
// "message", "name"} on failure.
type resendAnswer struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Message string `json:"message"`
}

// ResendResult is what [Resend.Deliver] returns for the relay to store: Resend's email
// id and the HTTP status on success; the status and Resend's error name and message on
// a failure that got an answer.
type ResendResult struct {
	ID      string `json:"id,omitempty"`
	Status  int    `json:"status"`
	Name    string `json:"name,omitempty"`
	Message string `json:"message,omitempty"`
}

// Deliver POSTs the row to Resend's /emails, once, with the row's key as
// Idempotency-Key. The payload is the same as for the SMTP [Connector]; the body is
// built from it the same way on every attempt, as Resend refuses a repeated key with a
// different body.
//
// Failures are classified for the relay: a payload that is not valid, a 101 Switching
// Protocols (its connection closed unread), a 3xx, and a 4xx other than 408, 409, 425
// and 429 are permanent (Resend's error name and message are in
// the error); 409 invalid_idempotent_request (the key was used with another body) is
// permanent and ambiguous (Resend sent an email under the key); 409
// concurrent_idempotent_requests, 408, 425, 429 and 5xx are retried, after
// Retry-After when given; a request that got no answer after it was written is
// [connectors.Ambiguous], and so are a 2xx whose answer cannot be read, a 409
// concurrent_idempotent_requests (an earlier request with the key, still in progress,
// may send the email) and a gateway's 502 or 504 (or Cloudflare's 520 or 524, which
// fronts Resend's API).
func (c *Resend) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	res, err := c.deliver(ctx, d)
	// An answer (a proxy's, a stand-in's at OUTBOX_EMAIL_API_BASE) may repeat the
	// request's Authorization header, the API key in it.
	return connectors.HideSecret(res, err, c.apiKey)
}

func (c *Resend) deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	body, err := c.build(d)
	if err != nil {
		return nil, connectors.Permanent(fmt.Errorf("deliver email via resend: %w", err))
	}

	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, ErrResendTimeout)
	defer cancel()
	ctx, sent := connectors.TraceSend(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, connectors.Permanent(fmt.Errorf("POST %s: build request: %w", c.target, err))
	}
	// Without GetBody the transport cannot resend the request by itself, which it
	// otherwise would on a reused connection that dies after the request was written
	// (the Idempotency-Key header makes the POST replayable to net/http). The relay owns
	// retries, and classifies that case as ambiguous.
	req.GetBody = nil
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", d.Key)
	req.Header.Set("User-Agent", "outboxd")

	resp, err := c.client.Do(req)
	if err != nil {
		return nil, c.sendError(ctx, err, sent(err))
	}
	defer resp.Body.Close() //nolint:errcheck // read to the limit below; nothing to report
	raw, readErr := io.ReadAll(io.LimitReader(resp.Body, maxResendAnswer))

	var ans resendAnswer
	_ = json.Unmarshal(raw, &ans) // an answer that is not Resend's JSON leaves it empty
	res := ResendResult{Status: resp.StatusCode}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		if readErr != nil || ans.ID == "" {
			// Resend accepted the request (the status says so) but the id was lost: it may
			// have sent the email, and the retry with the same key returns the stored answer.
			return nil, connectors.Ambiguous(fmt.Errorf("POST %s: Resend answered %d but the answer could not be read; Resend may have sent the email: %w",
				c.target, resp.StatusCode, cmp.Or(readErr, errors.New("no email id in it"))))
		}
		res.ID = ans.ID
		return connectors.MarshalResult(res), nil
	}
	res.Name, res.Message = ans.Name, connectors.Excerpt(ans.Message, maxResendMessage)
	if res.Name == "" && res.Message == "" {
		res.Message = connectors.Excerpt(string(raw), maxResendMessage)
	}
	return connectors.MarshalResult(res), c.classify(resp, res, readErr)
}

// build checks the payload and returns the request body. Its errors are the row's fault.
func (c *Resend) build(d connectors.Delivery) ([]byte, error) {
	if d.Key == "" {
		return nil, errors.New("the row has no idempotency key")
	}
	if problem := connectors.KeyHeaderProblem(d.Key); problem != "" {
		return nil, fmt.Errorf("the idempotency key %q cannot be sent: %s", d.Key, problem)
	}
	if len(d.Key) > maxResendKey {
		return nil, fmt.Errorf("the idempotency key is %d bytes; Resend accepts at most %d", len(d.Key), maxResendKey)
	}
	p, err := decodePayload(d.Payload)
	if err != nil {
		return nil, err
	}
	// Resend makes header lines of the subject and the addresses as they are given (over
	// SMTP, go-mail encodes them, RFC 2047), so a line break in one would end its header
	// and could start another, a Bcc say: refused, as in the payload's own headers.
	if !connectors.ValidHeaderValue(p.Subject) {
		return nil, errors.New(`payload: "subject" has control characters, which a Subject header cannot hold`)
	}
	e := resendEmail{From: c.from, Subject: p.Subject, Text: p.Text, HTML: p.HTML}
	for _, f := range []struct {
		name  string
		addrs Addresses
		dst   *[]string
	}{
		{"to", p.To, &e.To},
		{"cc", p.Cc, &e.Cc},
		{"bcc", p.Bcc, &e.Bcc},
		{"reply_to", p.ReplyTo, &e.ReplyTo},
	} {
		for _, s := range f.addrs {
			if _, err := mail.ParseAddress(s); err != nil {
				return nil, fmt.Errorf("payload: %q: %q is not an email address: %w", f.name, s, err)
			}
			if !connectors.ValidHeaderValue(s) { // net/mail takes them in a comment
				return nil, fmt.Errorf("payload: %q: %q has control characters, which an address header cannot hold", f.name, s)
			}
			*f.dst = append(*f.dst, strings.TrimSpace(s))
		}
	}
	if e.Headers, err = checkHeaders(p.Headers); err != nil {
		return nil, err
	}
	// The key travels in the mail too, as the SMTP transport sends it; Resend sets its own
	// Message-ID.
	e.Headers["Idempotency-Key"] = d.Key

	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// Deterministic for a given row (map keys are sorted), so a retry sends the same
	// body and Resend recognises it as the same request.
	if err := enc.Encode(e); err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// sendError classifies a request that got no answer.
func (c *Resend) sendError(ctx context.Context, err error, wrote bool) error {
	return connectors.HTTPSendError(ctx, err, wrote, c.target, c.timeout, ErrResendTimeout, "Resend may have sent the email")
}

// Resend's error names that decide a classification.
const (
	resendConcurrentRequests = "concurrent_idempotent_requests"
	resendKeyReused          = "invalid_idempotent_request"
)

// classify turns an answer that is not 2xx into a classified error. readErr is why its
// body could not be read to the end, if it could not.
func (c *Resend) classify(resp *http.Response, res ResendResult, readErr error) error {
	code := resp.StatusCode
	answered := fmt.Sprintf("POST %s: Resend answered %s", c.target, connectors.StatusText(code))
	if res.Name != "" {
		answered += ": " + res.Name
	}
	if res.Message != "" {
		answered += ": " + res.Message
	}
	retry := func() error {
		err := errors.New(answered)
		if d, ok := connectors.RetryAfterOf(resp.Header, time.Now()); ok {
			return connectors.RetryAfter(err, d)
		}
		return err
	}
	switch {
	case res.Name == resendKeyReused:
		// The key was used with a different body: retrying sends the same body again. Resend
		// keeps a key only for a request that sent its email, and a row's body changes only
		// with the connector's configuration (its From), so this is the row's email sent by
		// an attempt whose answer was lost: ambiguous, or a dead row would read as one
		// nothing was sent for, and its replay with a new key would send it again.
		return connectors.Ambiguous(connectors.Permanent(fmt.Errorf(
			"%s (an earlier request with this key sent an email with another body, perhaps this row's before the sender was changed: check before replaying the row with a new key)", answered)))
	case res.Name == resendConcurrentRequests:
		// An earlier request with the key is still in progress at Resend: an attempt
		// whose answer was lost, which may yet send the email. This attempt leaves the
		// key's outcome as unknown as that one did, so it is ambiguous too: the row's
		// mark tells of its latest attempt only, and a row whose attempts ran out on
		// these would otherwise end dead as if Resend had sent nothing.
		return connectors.Ambiguous(fmt.Errorf("%w (an earlier request with this key is still in progress at Resend and may send the email; a retry with the same key gets its answer)", retry()))
	case code == http.StatusConflict && readErr != nil:
		// Resend's 409s are both about an earlier request with the key, which sent the
		// email or may yet: the status line says as much when the body that names which
		// is lost on the way. A retry with the same key gets the whole answer.
		return connectors.Ambiguous(fmt.Errorf("%w (the connection dropped before the rest of the answer came: %v; an earlier request with this key may have sent the email)", retry(), readErr))
	case connectors.GatewayLostAnswer(code):
		// A gateway answered for Resend: it passed the request on and then lost Resend's
		// connection (502, or Cloudflare's 520) or stopped waiting for its answer (504,
		// Cloudflare's 524). Resend may have sent the email, as after a connection reset
		// of its own. All of Resend's API traffic comes through Cloudflare (Resend's
		// incident report of November 18, 2025), so its codes are Resend's gateway's.
		return connectors.Ambiguous(fmt.Errorf("%w (a gateway's answer: Resend may have sent the email)", retry()))
	case connectors.RetryableStatus(code):
		return retry()
	default: // 101, 3xx (not followed), other 4xx, codes outside the classes HTTP defines
		return connectors.Permanent(errors.New(answered))
	}
}
