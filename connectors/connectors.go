// Package connectors defines what the relay asks of a connector: deliver one row, and
// say honestly whether the receiver enforces the idempotency key.
//
// Each connector kind lives in its own package below this one (webhook, email, slack,
// payment) and keeps its SDK to itself. A connector classifies failures by wrapping them:
// [Permanent] for failures a retry cannot fix, [RetryAfter] for a receiver that named a
// delay, [Ambiguous] when the request may have reached the receiver and nobody knows
// whether it acted. Any other error is retried with backoff.
package connectors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Guarantee is what a connector's receiver promises about the idempotency key.
type Guarantee string

const (
	// Enforced: the receiver dedupes on the key (Stripe, receivers that honour
	// Idempotency-Key), so a retry after an ambiguous attempt is safe.
	Enforced Guarantee = "enforced"
	// Reconciled: the receiver does not dedupe, but the connector can ask it whether the
	// effect already happened before retrying.
	Reconciled Guarantee = "reconciled"
	// Forwarded: the key travels with the request but nothing downstream is known to
	// enforce it; a retry after an ambiguous attempt may duplicate the effect.
	Forwarded Guarantee = "forwarded"
)

// Delivery is one attempt to deliver one row.
type Delivery struct {
	// Key is the row's idempotency key, the same on every attempt.
	Key string
	// Attempt is this attempt's number, starting at 1.
	Attempt int
	// Payload is the row's payload, verbatim JSON.
	Payload json.RawMessage
	// Headers travel with the row, such as a W3C "traceparent".
	Headers map[string]string
	// PreviousAmbiguous is true when the row's latest attempt ended without the relay
	// knowing whether the receiver acted. It tells of that attempt only: a later attempt
	// that failed plainly clears it, while the ambiguous one before may still have acted.
	// So a reconciling connector looks before acting again on every attempt after the
	// first, as slack does, and not only when this is set.
	PreviousAmbiguous bool
	// FirstAttemptAt is when the row's first attempt started, by the relay's clock; zero
	// when unknown. An earlier attempt's effect is no older than it (a reconciling
	// connector bounds its look-back with it). Callers other than the relay should set it
	// on every attempt after the first: without it, Slack's look before a retry must reach
	// the conversation's beginning, and in one longer than its 10 pages it cannot tell and
	// fails the attempt as permanent and ambiguous even when nothing was posted.
	FirstAttemptAt time.Time
}

// Connector delivers rows to one receiver. Implementations are safe for concurrent use.
type Connector interface {
	// Deliver performs one attempt. On success it returns the receiver's answer to store
	// against the key (JSON). On failure it returns an error classified with [Permanent],
	// [RetryAfter] or [Ambiguous], or a plain error to retry with backoff; the result may
	// then still be non-nil (a 4xx body, say) and is stored too. When ctx ends mid-attempt
	// (a relay stopping), an attempt whose request may have gone out is [Ambiguous]; a
	// plain error that wraps ctx's error says nothing was sent, and the relay hands the
	// row back uncounted (any other is taken as the receiver's answer).
	Deliver(ctx context.Context, d Delivery) (json.RawMessage, error)
	// Guarantee says whether the receiver enforces the key.
	Guarantee() Guarantee
}

// KeyWindower is implemented by connectors whose receiver remembers idempotency keys
// only for a while (Stripe: 24 hours). The relay never sends an attempt of an enforced
// row that could reach the receiver after that window has passed since its first
// attempt, because the receiver would no longer recognise the key and a retry could act
// twice. By default the instance's maximum age ends within the window (relay's
// Instance.MaxAge), so a retry that would come later sends the row to dead; an attempt
// that would still go out after the window (a maximum age set longer, a row that waited)
// is not sent, and the row is held for an operator.
type KeyWindower interface {
	KeyWindow() time.Duration
}

// KeyWindow returns c's key window, or 0 when c does not declare one.
func KeyWindow(c Connector) time.Duration {
	if w, ok := c.(KeyWindower); ok {
		return w.KeyWindow()
	}
	return 0
}

// KeyForgotten reports whether an attempt started at t, which may last up to attemptMax,
// could reach a receiver that remembers idempotency keys for window (see [KeyWindower]; 0:
// for ever) after it has forgotten the key of a row whose first attempt started at first
// (zero: none yet). The relay does not send such an attempt of an enforced row, and holds
// the row; a replay under the row's own key would only have it held again.
func KeyForgotten(window, attemptMax time.Duration, first, t time.Time) bool {
	return window > 0 && !first.IsZero() && t.Add(attemptMax).After(first.Add(window))
}

// Timeouter is implemented by connectors whose attempts have a time limit. The relay
// claims rows ahead of its free workers only for those: knowing the limit, it can tell
// whether a row that waited for a worker can still finish its attempt within its lease.
type Timeouter interface {
	Timeout() time.Duration
}

// Timeout returns c's time limit for one attempt, or 0 when c does not declare one.
func Timeout(c Connector) time.Duration {
	if t, ok := c.(Timeouter); ok {
		return t.Timeout()
	}
	return 0
}

// Permanent marks err as a failure that retrying cannot fix: the row goes to dead.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, permanent: true}
}

// RetryAfter marks err as retryable no sooner than after d (a receiver's Retry-After).
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, retryAfter: d, hasDelay: true}
}

// Ambiguous marks err as an attempt whose effect is unknown: the request may have reached
// the receiver, which may have acted (a timeout after the request was written, a
// connection reset before the answer). It may wrap an error already marked RetryAfter.
func Ambiguous(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, ambiguous: true}
}

type classified struct {
	err        error
	permanent  bool
	ambiguous  bool
	retryAfter time.Duration
	hasDelay   bool
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

// The methods below are what the Is* functions look for, so an error type of a
// connector's own can classify itself by having them.

func (c *classified) Permanent() bool { return c.permanent }
func (c *classified) Ambiguous() bool { return c.ambiguous }
func (c *classified) RetryDelay() (time.Duration, bool) {
	return c.retryAfter, c.hasDelay
}

// IsPermanent reports whether any error in err's chain says it is permanent.
func IsPermanent(err error) bool {
	return anyInChain(err, func(e error) bool {
		p, ok := e.(interface{ Permanent() bool })
		return ok && p.Permanent()
	})
}

// IsAmbiguous reports whether any error in err's chain says its effect is unknown.
func IsAmbiguous(err error) bool {
	return anyInChain(err, func(e error) bool {
		a, ok := e.(interface{ Ambiguous() bool })
		return ok && a.Ambiguous()
	})
}

// RetryDelay returns the delay a receiver asked for, if any error in err's chain has one.
func RetryDelay(err error) (time.Duration, bool) {
	var (
		d  time.Duration
		ok bool
	)
	anyInChain(err, func(e error) bool {
		r, is := e.(interface{ RetryDelay() (time.Duration, bool) })
		if is {
			d, ok = r.RetryDelay()
		}
		return ok
	})
	return d, ok
}

// anyInChain walks err's tree (Unwrap() error and Unwrap() []error) until match holds.
func anyInChain(err error, match func(error) bool) bool {
	for err != nil {
		if match(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if anyInChain(e, match) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// ErrUnknownConnector is returned by [Set.Get] for an instance the relay does not have.
var ErrUnknownConnector = errors.New("connector not configured")

// Set holds the configured connector instances by name ("webhook", "webhook:crm").
type Set map[string]Connector

// Get returns the instance named name.
func (s Set) Get(name string) (Connector, error) {
	c, ok := s[name]
	if !ok {
		return nil, ErrUnknownConnector
	}
	return c, nil
}

// maxRetryAfter is the longest Retry-After delay honoured: a longer one is more likely a
// receiver's mistake than a plan, and would send the row to dead past its maximum age.
const maxRetryAfter = 365 * 24 * time.Hour

// ParseRetryAfter parses a Retry-After header value, delta-seconds or an HTTP date (RFC
// 9110 section 10.2.3), into a delay from now. A date in the past means no delay; a
// value that is neither, or a delay over a year, is ignored.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 || secs > int64(maxRetryAfter/time.Second) {
			return 0, false
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil || t.Sub(now) > maxRetryAfter {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// RetryAfterOf is the delay the Retry-After header of an answer with headers h asks for
// (see [ParseRetryAfter]). An HTTP date there is a time on the receiver's clock, so it
// is measured from the answer's Date, the receiver's time when it answered, when that
// parses; else from now. Against the sender's clock, one minutes ahead of the receiver's
// would retry before the receiver asked, and one behind would wait minutes longer.
func RetryAfterOf(h http.Header, now time.Time) (time.Duration, bool) {
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		now = date
	}
	return ParseRetryAfter(h.Get("Retry-After"), now)
}

// HTTPSendError classifies an HTTP request that got no answer, for connectors that call
// an HTTP API. Once the request was written (wrote, from httptrace's WroteRequest) the
// receiver may have acted, so the error is [Ambiguous]; mayHave says what the receiver may
// have done ("the receiver may have acted"). errTimeout is the connector's timeout cause,
// found in ctx when the attempt ran past timeout.
func HTTPSendError(ctx context.Context, err error, wrote bool, target string, timeout time.Duration, errTimeout error, mayHave string) error {
	// *url.Error repeats the method and URL, which the message already starts with.
	cause := err
	if ue, ok := errors.AsType[*url.Error](err); ok {
		cause = ue.Err
	}
	timedOut := errors.Is(context.Cause(ctx), errTimeout)
	if timedOut && !errors.Is(cause, errTimeout) {
		cause = fmt.Errorf("%w: %w", errTimeout, cause)
	}
	switch {
	case wrote && timedOut:
		return Ambiguous(fmt.Errorf("POST %s: no answer within %s after the request was sent; %s: %w", target, timeout, mayHave, cause))
	case wrote && ctx.Err() != nil:
		return Ambiguous(fmt.Errorf("POST %s: attempt cancelled after the request was sent; %s: %w", target, mayHave, cause))
	case wrote:
		// Not "connection closed": the answer may also have come malformed, or with
		// headers past MaxAnswerHeaderBytes, or (HTTP/2) its stream been refused.
		return Ambiguous(fmt.Errorf("POST %s: no readable answer after the request was sent; %s: %w", target, mayHave, cause))
	case timedOut:
		return fmt.Errorf("POST %s: the request could not be sent within %s: %w", target, timeout, cause)
	default:
		return fmt.Errorf("POST %s: the request could not be sent: %w", target, cause)
	}
}

// StatusText names an HTTP status for a person: "503 Service Unavailable".
func StatusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return strconv.Itoa(code) + " " + t
	}
	return strconv.Itoa(code)
}

// Excerpt squeezes the white space of s to single spaces and cuts it at limit bytes on a
// character boundary, marking a cut with "…", so a receiver's answer fits in an error
// message. Invalid UTF-8 becomes U+FFFD.
func Excerpt(s string, limit int) string {
	s = strings.ToValidUTF8(strings.Join(strings.Fields(s), " "), "\uFFFD")
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// HideSecret returns res and err with each of secrets replaced by xxxxx in res and in
// err's message, in the order given (a longer one that holds a shorter first), err
// keeping its classification and what it wraps. A receiver, a proxy or a stand-in that
// repeats the request's Authorization header in its answer (stripe-mock refuses a key
// that is not a test key so: "Authorization was 'Bearer sk_live_…'"), or a server that
// quotes a refused login, would otherwise put an API key, token or password in the
// row's result and last_error, which the intent API and MCP show to agents.
func HideSecret(res json.RawMessage, err error, secrets ...string) (json.RawMessage, error) {
	var inErr []string
	for _, secret := range secrets {
		if secret == "" {
			continue
		}
		if bytes.Contains(res, []byte(secret)) {
			res = bytes.ReplaceAll(res, []byte(secret), []byte(redacted))
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			inErr = append(inErr, secret)
		}
	}
	if len(inErr) > 0 {
		err = &secretHidden{err: err, secrets: inErr}
	}
	return res, err
}

// secretHidden is an error whose message shows xxxxx for secrets (see [HideSecret]).
type secretHidden struct {
	err     error
	secrets []string
}

func (e *secretHidden) Error() string {
	msg := e.err.Error()
	for _, secret := range e.secrets {
		msg = strings.ReplaceAll(msg, secret, redacted)
	}
	return msg
}

func (e *secretHidden) Unwrap() error { return e.err }

// MarshalResult encodes a connector's result for storage. It keeps <, > and & as they are
// (results are read by people) and panics only on a value JSON cannot hold, which is a
// programmer error in the connector.
func MarshalResult(v any) json.RawMessage {
	e := resultEncoders.Get().(*resultEncoder)
	defer resultEncoders.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		panic("connectors: result cannot be encoded: " + err.Error())
	}
	return bytes.Clone(bytes.TrimRight(e.buf.Bytes(), "\n"))
}

// resultEncoder is MarshalResult's encoder and buffer, kept between calls: a relay
// encodes a result for every attempt.
type resultEncoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

var resultEncoders = sync.Pool{New: func() any {
	e := &resultEncoder{}
	e.enc = json.NewEncoder(&e.buf)
	e.enc.SetEscapeHTML(false)
	return e
}}

// ValidHeaderValue reports whether v can be sent as a header value, HTTP's or a mail's:
// it holds no control character other than tab, so it cannot end the header or start
// another. A key that fails it cannot be an Idempotency-Key header, and no retry
// changes that.
func ValidHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if ch := v[i]; (ch < ' ' && ch != '\t') || ch == 0x7f {
			return false
		}
	}
	return true
}

// MaxAnswerHeaderBytes bounds the headers of an answer a connector's shared transport
// reads (http.Transport's MaxResponseHeaderBytes). net/http's own bound is 10 MiB, and
// an attempt holds about three times its answer's headers while it reads them: at the
// relay's default of 128 deliveries in flight, one receiver answering with headers that
// large held gigabytes, enough to have the relay killed for memory and every instance's
// deliveries stopped with it. 64 KiB is four times what Node's HTTP client takes, and
// far more than any API or webhook receiver sends; an answer past it is not read, and
// its attempt fails as one whose request was sent (the receiver may have acted).
const MaxAnswerHeaderBytes = 64 << 10

// CloneDefaultTransport returns a clone of http.DefaultTransport (proxy settings from the
// environment, HTTP/2 when offered) for a connector's shared transport or, when an
// application has put a RoundTripper of its own there (an instrumenting wrapper, a test's
// mock), which cannot be cloned, a transport with the settings net/http gives its
// default one. A type assertion would panic there. Either way, it reads no answer whose
// headers exceed [MaxAnswerHeaderBytes], and counts the bytes written to its
// connections (see [TraceSend]).
func CloneDefaultTransport() *http.Transport {
	t, ok := http.DefaultTransport.(*http.Transport)
	if ok {
		t = t.Clone()
	} else {
		t = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          100,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: 1 * time.Second,
		}
	}
	t.MaxResponseHeaderBytes = MaxAnswerHeaderBytes
	// Its connections count the bytes written to them, so that an attempt whose request
	// never left is not taken for one the receiver may have acted on (see TraceSend).
	// Not where an application dials by the deprecated Dial only.
	if t.DialContext != nil || t.Dial == nil {
		dial := t.DialContext
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		t.DialContext = countWrites(dial)
	}
	return t
}

// NoProtocolSwitch returns next wrapped so that a 101 Switching Protocols answer comes
// back with its connection closed and an empty body. net/http hands such an answer's
// connection over as its body, and the attempt's timeout no longer bounds it: an SDK or
// a connector that reads the body (stripe-go reads every answer's; Resend's reads its
// error) would wait for the receiver to hang up, past the attempt's time limit and its
// row's lease. A 101 is no answer to an API's POST, so it is classified by its status
// alone, as the webhook connector does with its own.
func NoProtocolSwitch(next http.RoundTripper) http.RoundTripper { return noProtocolSwitch{next} }

type noProtocolSwitch struct{ next http.RoundTripper }

func (t noProtocolSwitch) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusSwitchingProtocols {
		_ = resp.Body.Close()
		resp.Body = http.NoBody
	}
	return resp, err
}

// CloseIdleConnections closes the idle connections of the transport underneath.
func (t noProtocolSwitch) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// DialableHost reports whether host is an IP address or a DNS name (labels of letters,
// digits, '-' and '_', and an optional final dot): anything else (a space from an env
// file, a "/") no resolver looks up, and every attempt would fail until its row was dead.
func DialableHost(host string) bool {
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	for label := range strings.SplitSeq(strings.TrimSuffix(host, "."), ".") {
		if label == "" {
			return false
		}
		for i := 0; i < len(label); i++ {
			if ch := label[i]; !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_') {
				return false
			}
		}
	}
	return true
}

// ValidMailHeaderName reports whether name is a mail header field name (RFC 5322 section
// 3.6.8: printable ASCII other than colon).
func ValidMailHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if ch := name[i]; ch < 33 || ch > 126 || ch == ':' {
			return false
		}
	}
	return true
}

// ReservedMailHeader reports whether the email connectors set the header with the
// canonical name (textproto.CanonicalMIMEHeaderKey) themselves, or from the payload's own
// fields: a payload header of that name is refused.
func ReservedMailHeader(canonical string) bool { return reservedMailHeaders[canonical] }

var reservedMailHeaders = map[string]bool{
	"Message-Id":                true,
	"Idempotency-Key":           true,
	"From":                      true,
	"Sender":                    true,
	"To":                        true,
	"Cc":                        true,
	"Bcc":                       true,
	"Reply-To":                  true,
	"Subject":                   true,
	"Date":                      true,
	"Return-Path":               true,
	"Mime-Version":              true,
	"Content-Type":              true,
	"Content-Transfer-Encoding": true,
	"Content-Disposition":       true,
	"Content-Id":                true,
	"Dkim-Signature":            true,
	"Received":                  true,
}

// IsSlackConversationID reports whether channel is what the Slack connector takes as a
// channel: the ID of a public or private channel, a multi-person or a direct message
// conversation (a name cannot be looked up for a retry).
func IsSlackConversationID(channel string) bool { return slackConversationID.MatchString(channel) }

var slackConversationID = regexp.MustCompile(`^[CGD][A-Z0-9]{2,}$`)

// IsSlackMessageTS reports whether ts is written as Slack writes a message's ts
// ("1700000000.000100"; defs_ts in its OpenAPI description of the Web API). Slack answers
// "ok" to a thread_ts written otherwise (a float's digits, trailing zeros dropped), and
// the reply is seen in no thread and not in the channel.
func IsSlackMessageTS(ts string) bool { return slackMessageTS.MatchString(ts) }

var slackMessageTS = regexp.MustCompile(`^[0-9]{10}\.[0-9]{6}$`)

// KeyHeaderProblem says why key cannot travel as an Idempotency-Key header (HTTP's or a
// mail's), or returns "" when it can. A control character could end the header or start
// another; white space at either end is dropped by the receiver's parser, which would
// then see another key, perhaps another row's, and answer with that row's stored
// result. No retry changes either.
func KeyHeaderProblem(key string) string {
	if !ValidHeaderValue(key) {
		return "it has control characters, so it cannot travel as a header"
	}
	if trimmed := strings.Trim(key, " \t"); trimmed != key {
		return fmt.Sprintf("it begins or ends with white space, which a header value does not keep: the receiver would see the key %q", trimmed)
	}
	return ""
}

// GatewayLostAnswer reports whether code is a gateway's answer for a receiver that took
// the request and gave no answer of its own: 502 Bad Gateway and 504 Gateway Timeout, and
// Cloudflare's own codes for the same (it fronts many receivers, Resend's API among
// them): 520, the origin reset the connection or answered nothing, and 524, the origin
// did not answer in time. Its 521, 522 and 523 say it never reached the origin, so they
// are not among them. The receiver may have acted behind such an answer, as after a
// connection reset of its own, so a connector marks it [Ambiguous].
func GatewayLostAnswer(code int) bool {
	switch code {
	case http.StatusBadGateway, http.StatusGatewayTimeout, 520, 524:
		return true
	}
	return false
}

// RetryableStatus reports whether an HTTP answer with status code is worth retrying, as
// DESIGN.md classes them: 408, 409, 425, 429 and 5xx. Other 4xx are the request's fault,
// and retrying cannot change them.
func RetryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return code >= 500 && code <= 599
}
