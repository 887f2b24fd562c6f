package webhook

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outboxd/connectors"
)

// Config configures a [Connector]. A zero field means its default.
type Config struct {
	// URL is where rows are POSTed: an absolute http or https URL, without white space at
	// either end. A space or a character past ASCII in its query is sent
	// percent-encoded, as a browser sends it. Required.
	URL string
	// Secret is a Standard Webhooks signing secret, "whsec_" followed by base64, or
	// several separated by white space (spaces, tabs, newlines), as OUTBOX_WEBHOOK_SECRET
	// holds them; see Secrets for what several do. When set, each request carries
	// webhook-id, webhook-timestamp and webhook-signature headers. Defaults to no
	// signing, as does a value of white space only.
	Secret string
	// Secrets are Standard Webhooks signing secrets, each "whsec_" followed by base64,
	// for a caller that holds them apart: the webhook-signature header carries one
	// signature per secret, in this order, separated by spaces, and a receiver accepts
	// the request when any of them matches its secret. That is how a secret is rotated
	// without refused deliveries: sign with the old and the new, give the receivers the
	// new, then drop the old. Set Secret or Secrets, not both. Defaults to none.
	Secrets []string
	// Timeout bounds one attempt, from dialling to the end of the answer's excerpt.
	// Defaults to 10s.
	Timeout time.Duration
	// Guarantee is what the receiver promises about Idempotency-Key. Set
	// [connectors.Enforced] only for a receiver that dedupes on it. Defaults to
	// [connectors.Forwarded]; [connectors.Reconciled] is refused (the connector cannot
	// ask the receiver what it did).
	Guarantee connectors.Guarantee
	// Client's Transport sends the requests (http.DefaultTransport when it has none).
	// The request goes straight to the transport: redirects are never followed, cookies
	// are not kept, and Timeout (not the client's) bounds an attempt. Defaults to a
	// client on [DefaultTransport].
	Client *http.Client
	// MaxResultBody is how many bytes of the receiver's answer the result keeps.
	// Defaults to 1024.
	MaxResultBody int
	// NowFunc is the clock for webhook-timestamp, and for Retry-After dates in answers
	// without a Date header (see [connectors.RetryAfterOf]). Defaults to time.Now.
	NowFunc func() time.Time
}

// String describes c without its secrets, or the URL's path and query, which may hold a
// token (as LogValue shows it), as the other connectors' configurations do.
func (c Config) String() string {
	return fmt.Sprintf("webhook.Config{URL: %s, Secret: %s, Timeout: %s, Guarantee: %s}",
		connectors.RedactEndpoint(c.URL), c.redactedSecret(), c.Timeout, c.Guarantee)
}

// GoString keeps the secrets out of %#v too.
func (c Config) GoString() string { return c.String() }

// redactedSecret is REDACTED when c signs, else empty.
func (c Config) redactedSecret() string {
	if strings.TrimSpace(c.Secret) != "" || len(c.Secrets) > 0 {
		return "REDACTED"
	}
	return ""
}

// LogValue keeps the secret out of logs.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("url", connectors.RedactEndpoint(c.URL)),
		slog.String("secret", c.redactedSecret()),
		slog.Duration("timeout", c.Timeout),
		slog.String("guarantee", string(c.Guarantee)),
	)
}

const (
	defaultTimeout       = 10 * time.Second
	defaultMaxResultBody = 1024
	secretPrefix         = "whsec_"
	// maxDrain is how much of an answer's remaining body is read and thrown away so its
	// connection can serve the next request; past that, closing the connection is cheaper.
	maxDrain = 64 << 10
	// maxErrorExcerpt bounds the body excerpt quoted in an error message, which ends up in
	// last_error for a person to read; the result keeps the longer excerpt.
	maxErrorExcerpt = 200
)

// ErrTimeout is the cause of an attempt that ran past [Config.Timeout]; errors.Is finds
// it in the error Deliver returns.
var ErrTimeout = errors.New("webhook attempt timed out")

// Connector delivers rows to one webhook URL. It is safe for concurrent use.
type Connector struct {
	url    string
	target string // the URL as errors show it: scheme and host (connectors.RedactEndpoint)
	// echoes replaces the parts of the URL that target hides (its path, query, query
	// values, user name and password, as a receiver may quote them) with xxxxx, longest
	// first; nil when there are none (see urlEchoes). echoParts are those parts.
	echoes    *strings.Replacer
	echoParts []string
	// secrets are the signing keys, in the order their signatures are sent; nil when
	// requests are not signed.
	secrets [][]byte
	// authorization is the Basic credentials of a URL with a user name (as http.Client
	// would send them; the connector calls the transport directly), else empty.
	authorization string
	timeout       time.Duration
	guarantee     connectors.Guarantee
	transport     http.RoundTripper
	maxBody       int
	now           func() time.Time
}

var _ connectors.Connector = (*Connector)(nil)

var sharedTransport = sync.OnceValue(func() *http.Transport {
	t := connectors.CloneDefaultTransport()
	// The relay sends many rows to few receivers at once: keep enough idle connections
	// per receiver that a burst doesn't open (and then close) new ones.
	t.MaxIdleConns = 4096
	t.MaxIdleConnsPerHost = 512
	t.IdleConnTimeout = 90 * time.Second
	// No compressed answers asked for: an answer is read for an excerpt of a kilobyte,
	// which gzip saves little of, while decompressing it cost each attempt 5 kB and 12
	// allocations more, and the transport's decompression failed on an answer that only
	// said it was gzip, losing all of it. A receiver that compresses all the same is
	// read by answerBody.
	t.DisableCompression = true
	return t
})

// DefaultTransport returns the keep-alive transport shared by every [Connector] built
// without a [Config.Client]. It is a clone of http.DefaultTransport (proxy settings from
// the environment, HTTP/2 when the receiver offers it; net/http's default settings when
// an application has replaced http.DefaultTransport with another RoundTripper) that
// keeps up to 512 idle connections per host for 90s, reads no answer whose headers
// exceed [connectors.MaxAnswerHeaderBytes], and asks for no compressed answers (the
// connector reads a gzip answer itself).
func DefaultTransport() *http.Transport { return sharedTransport() }

// New returns a connector for cfg, or an error naming the field that is wrong.
func New(cfg Config) (*Connector, error) {
	cfg = cfg.withDefaults()
	c := &Connector{
		timeout:   cfg.Timeout,
		guarantee: cfg.Guarantee,
		maxBody:   cfg.MaxResultBody,
		now:       cfg.NowFunc,
	}
	var errs []error
	u, err := parseURL(cfg.URL)
	if err != nil {
		errs = append(errs, err)
	}
	var secretErrs []error
	c.secrets, secretErrs = parseSecrets(cfg.Secret, cfg.Secrets)
	errs = append(errs, secretErrs...)
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout: %s is negative", cfg.Timeout))
	}
	if cfg.MaxResultBody < 0 {
		errs = append(errs, fmt.Errorf("MaxResultBody: %d is negative", cfg.MaxResultBody))
	}
	switch cfg.Guarantee {
	case connectors.Enforced, connectors.Forwarded:
	case connectors.Reconciled:
		// The connector cannot ask a webhook receiver what it did, so it must not claim
		// to: the relay would resend ambiguous attempts blindly, hold policy or not.
		errs = append(errs, errors.New("Guarantee: reconciled is not possible for a webhook (the connector cannot look up what the receiver did); use enforced or forwarded"))
	default:
		errs = append(errs, fmt.Errorf("Guarantee: %q is not enforced or forwarded", cfg.Guarantee))
	}
	for i, err := range errs {
		errs[i] = fmt.Errorf("webhook config: %w", err) // one line per problem, each complete
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// url.Parse keeps a query as written, and net/http writes it so into the request
	// line, where a space ends the request target (RFC 9112 section 3.2) and a byte past
	// ASCII is refused by some parsers (Node's): the receiver would answer 400 to every
	// row. Those are percent-encoded, as a browser sends them; the values read the same.
	u.RawQuery = escapeQuery(u.RawQuery)
	c.url, c.target = u.String(), connectors.RedactEndpoint(u.String())
	c.echoes, c.echoParts = urlEchoes(u)
	if u.User != nil {
		c.authorization = "Basic " + basicCredentials(u.User)
	}

	// The transport, not http.Client: a client's redirect and cookie handling are not
	// wanted, and its per-request header copy costs more than the rest of an attempt.
	// The shared one is built only for a connector that uses it.
	if cfg.Client != nil {
		c.transport = cmp.Or[http.RoundTripper](cfg.Client.Transport, http.DefaultTransport)
	} else {
		c.transport = DefaultTransport()
	}
	return c, nil
}

func (cfg Config) withDefaults() Config {
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.Guarantee = cmp.Or(cfg.Guarantee, connectors.Forwarded)
	cfg.MaxResultBody = cmp.Or(cfg.MaxResultBody, defaultMaxResultBody)
	if cfg.NowFunc == nil {
		cfg.NowFunc = time.Now
	}
	return cfg
}

func parseURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("URL: required")
	}
	return connectors.ParseHTTPURL("URL", raw)
}

// escapeQuery percent-encodes the spaces and the bytes past ASCII of a raw query, and
// leaves the rest as written, escapes included.
func escapeQuery(q string) string {
	if !strings.ContainsFunc(q, func(r rune) bool { return r == ' ' || r >= utf8.RuneSelf }) {
		return q
	}
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		if ch := q[i]; ch == ' ' || ch >= utf8.RuneSelf {
			fmt.Fprintf(&b, "%%%02X", ch)
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

// parseSecrets returns the keys of the secrets in list (separated by white space) or in
// each, in order, or the problems: one per bad secret, naming its place, so that each
// can be found. Splitting at any white space cannot cut a secret: neither "whsec_" nor
// base64 has any, and a value read from a file or a multi-line variable may put each
// secret on its own line.
func parseSecrets(list string, each []string) ([][]byte, []error) {
	fields := strings.Fields(list)
	if len(fields) > 0 && len(each) > 0 {
		return nil, []error{errors.New("Secret and Secrets: both are set; set one of them")}
	}
	name := func(i int) string { return fmt.Sprintf("Secrets[%d]", i) }
	if len(fields) > 0 {
		each = fields
		name = func(i int) string {
			if len(fields) == 1 {
				return "Secret"
			}
			return fmt.Sprintf("Secret (secret %d of %d)", i+1, len(fields))
		}
	}
	var (
		keys [][]byte
		errs []error
	)
	for i, s := range each {
		key, err := parseSecret(name(i), s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		keys = append(keys, key)
	}
	if errs != nil {
		return nil, errs
	}
	return keys, nil
}

func parseSecret(name, s string) ([]byte, error) {
	// The messages never quote the secret.
	rest, ok := strings.CutPrefix(s, secretPrefix)
	if !ok {
		return nil, fmt.Errorf(`%s: must start with "whsec_" (the Standard Webhooks format)`, name)
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, fmt.Errorf(`%s: the part after "whsec_" is not valid base64`, name)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf(`%s: nothing after "whsec_"`, name)
	}
	return key, nil
}

// String names the connector by its URL's scheme and host (a path or query may hold a
// token), and never shows the secret.
func (c *Connector) String() string { return "webhook " + c.target }

// GoString is String: %#v would print the fields, the secrets among them.
func (c *Connector) GoString() string { return c.String() }

// LogValue keeps the secret out of logs.
func (c *Connector) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("url", c.target),
		slog.Bool("signed", c.secrets != nil),
		slog.String("guarantee", string(c.guarantee)),
	)
}

// Guarantee reports what the receiver promises about Idempotency-Key, as configured.
func (c *Connector) Guarantee() connectors.Guarantee { return c.guarantee }

// Timeout is the time limit of one attempt (see [connectors.Timeouter]).
func (c *Connector) Timeout() time.Duration { return c.timeout }

// result is what Deliver returns for the relay to store.
type result struct {
	Status    int    `json:"status"`
	Body      string `json:"body"`
	Truncated bool   `json:"truncated,omitempty"`
}

// reservedHeaders are set by the connector; a row's header of the same name is dropped.
var reservedHeaders = map[string]bool{
	"Content-Type":      true,
	"Content-Length":    true,
	"Transfer-Encoding": true,
	"Connection":        true,
	"Keep-Alive":        true,
	"Proxy-Connection":  true,
	"Te":                true,
	"Trailer":           true,
	"Upgrade":           true,
	"Expect":            true,
	"Host":              true,
	"Idempotency-Key":   true,
	"User-Agent":        true,
	"Webhook-Id":        true,
	"Webhook-Timestamp": true,
	"Webhook-Signature": true,
	// A row's own would ask for compressed answers (br, zstd) that the connector does
	// not decompress (see answerBody): the stored result would hold the compressed
	// bytes instead of the receiver's answer.
	"Accept-Encoding": true,
}

// Deliver POSTs d.Payload to the configured URL, once. See the package documentation for
// the headers sent and how the answer is classified.
func (c *Connector) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	if d.Key == "" {
		return nil, connectors.Permanent(errors.New("deliver webhook: the row has no idempotency key"))
	}
	if problem := connectors.KeyHeaderProblem(d.Key); problem != "" {
		return nil, connectors.Permanent(fmt.Errorf("deliver webhook: the idempotency key %q cannot be sent: %s", d.Key, problem))
	}
	if !json.Valid(d.Payload) {
		// The reader's reason: a row's payload is jsonb, always valid JSON, but jsonb
		// takes nesting deeper than Go's reader does ("exceeded max depth").
		err := json.Unmarshal(d.Payload, new(json.RawMessage))
		return nil, connectors.Permanent(fmt.Errorf("deliver webhook: the payload cannot be read as JSON: %v "+
			"(the reader refuses nesting deeper than 10,000 levels)", err))
	}

	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, ErrTimeout)
	defer cancel()
	ctx, sent := connectors.TraceSend(ctx)

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(d.Payload))
	if err != nil {
		return nil, connectors.Permanent(fmt.Errorf("POST %s: build request: %w", c.target, err))
	}
	// Without GetBody the transport cannot resend the request by itself. It otherwise
	// would, on a reused connection that dies after the request was written, because the
	// Idempotency-Key header marks the POST replayable to net/http: a second send the
	// relay never sees, which turns an ambiguous attempt into a silent duplicate for a
	// receiver that does not dedupe. The relay owns retries.
	req.GetBody = nil
	for name, value := range d.Headers {
		name = http.CanonicalHeaderKey(name)
		if reservedHeaders[name] {
			continue
		}
		if !validHeader(name, value) {
			return nil, connectors.Permanent(fmt.Errorf("POST %s: the row's header %q is not a valid HTTP header", c.target, name))
		}
		if _, dup := req.Header[name]; dup {
			// Two of the row's names differ only in case: which one won would depend on
			// map order, so each attempt could send a different value.
			return nil, connectors.Permanent(fmt.Errorf("POST %s: the row has more than one header named %q (names differing only in case)", c.target, name))
		}
		req.Header.Set(name, value)
	}
	if c.authorization != "" && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", c.authorization)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", d.Key)
	req.Header.Set("User-Agent", "outboxd")
	if c.secrets != nil {
		ts := strconv.FormatInt(c.now().Unix(), 10)
		req.Header.Set("Webhook-Id", d.Key)
		req.Header.Set("Webhook-Timestamp", ts)
		req.Header.Set("Webhook-Signature", signature(c.secrets, d.Key, ts, d.Payload))
	}

	resp, err := c.transport.RoundTrip(req)
	if err != nil {
		return nil, c.sendError(ctx, req, err, sent(err))
	}
	if resp.StatusCode < 200 {
		// 101 Switching Protocols is the only 1xx that ends a request (the transport
		// reads past the others). Its body is the connection itself, which the attempt's
		// timeout no longer bounds: reading or draining it would wait for the receiver to
		// hang up, so it is closed unread.
		_ = resp.Body.Close()
		return connectors.MarshalResult(result{Status: resp.StatusCode}), c.classify(resp, "")
	}
	defer func() {
		_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
		_ = resp.Body.Close()
	}()

	// A body cut short (a timeout while reading it, say) still leaves the status code,
	// which is the receiver's answer; the excerpt is then marked truncated.
	excerpt, truncated := readExcerpt(answerBody(resp), c.maxBody)
	// Before it is stored or quoted: an answer may repeat what target hides.
	if c.echoes != nil {
		if truncated {
			excerpt = dropCutEcho(excerpt, c.echoParts)
		}
		excerpt = c.echoes.Replace(excerpt)
	}
	res := connectors.MarshalResult(result{Status: resp.StatusCode, Body: excerpt, Truncated: truncated})
	return res, c.classify(resp, excerpt)
}

// minEcho is the length from which a part of the URL is hidden in answers: shorter ones
// (a path of "/h", a query value of "1") hold no token, and replacing them with the
// longer "xxxxx" could take an excerpt past its bound.
const minEcho = 5

// urlEchoes returns the parts of u that [connectors.RedactEndpoint] hides and that an
// answer may quote: Express answers an unknown route "Cannot POST <path>", and redirects
// (its res.redirect, Rails', Apache's) name their target, which often repeats the
// path and query, in the body. A token in the URL would otherwise reach last_error, the
// stored result and, through the intent API, agents.
func urlEchoes(u *url.URL) (*strings.Replacer, []string) {
	var parts []string
	add := func(s ...string) {
		for _, p := range s {
			if len(p) >= minEcho && !slices.Contains(parts, p) {
				parts = append(parts, p)
			}
		}
	}
	if path := u.EscapedPath(); (path != "" && path != "/") || u.RawQuery != "" {
		add(u.RequestURI(), path, u.Path, strings.ReplaceAll(u.Path, "/", `\/`))
	}
	add(u.RawQuery)
	for pair := range strings.SplitSeq(u.RawQuery, "&") {
		_, raw, _ := strings.Cut(pair, "=")
		add(raw)
		if v, err := url.QueryUnescape(raw); err == nil {
			add(v)
		}
	}
	if u.User != nil {
		password, _ := u.User.Password()
		// And as they are sent, HTTP Basic authentication's base64 of "user:password",
		// which a receiver that repeats the request's Authorization header quotes.
		basic := basicCredentials(u.User)
		add(u.User.Username(), password, basic, strings.ReplaceAll(basic, "/", `\/`))
	}
	if len(parts) == 0 {
		return nil, nil
	}
	// A Replacer tries its pairs in order at each place: the longest part first.
	slices.SortStableFunc(parts, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(parts))
	for _, p := range parts {
		pairs = append(pairs, p, "xxxxx")
	}
	return strings.NewReplacer(pairs...), parts
}

// dropCutEcho removes from the end of an excerpt cut at its limit the start of one of
// parts that the cut split ("Cannot POST /hooks/T0K" of /hooks/T0KEN): the replacer
// finds only whole parts, and would leave all of a token but its last bytes.
func dropCutEcho(excerpt string, parts []string) string {
	cut := 0
	for _, p := range parts {
		for n := min(len(p)-1, len(excerpt)); n > cut; n-- {
			if strings.HasSuffix(excerpt, p[:n]) {
				cut = n
				break
			}
		}
	}
	return excerpt[:len(excerpt)-cut]
}

// basicCredentials is the base64 of "user:password", as HTTP Basic authentication sends
// a URL's user info.
func basicCredentials(user *url.Userinfo) string {
	password, _ := user.Password()
	return base64.StdEncoding.EncodeToString([]byte(user.Username() + ":" + password))
}

// signature returns the webhook-signature value for one request: each secret's
// signature, in order, separated by single spaces. The specification's list is "space
// delimited", and its reference libraries split it at each " ": a tab between two
// signatures would hide both from them.
func signature(secrets [][]byte, id, ts string, body []byte) string {
	if len(secrets) == 1 {
		return sign(secrets[0], id, ts, body)
	}
	sigs := make([]string, len(secrets))
	for i, secret := range secrets {
		sigs[i] = sign(secret, id, ts, body)
	}
	return strings.Join(sigs, " ")
}

// sign returns one secret's "v1," signature of a request.
func sign(secret []byte, id, ts string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// sendError classifies a request that got no answer.
func (c *Connector) sendError(ctx context.Context, req *http.Request, err error, wrote bool) error {
	return connectors.HTTPSendError(ctx, err, wrote, c.target+c.via(req), c.timeout, ErrTimeout, "the receiver may have acted")
}

// via names the proxy that req goes through, as " (through the proxy http://host:port)"
// for an error's first words, or returns "" when it goes straight to the receiver. A
// proxy's refusal otherwise read as the receiver's: "the request could not be sent: Bad
// Gateway" for an https URL whose tunnel the proxy refused, "receiver answered 407
// Proxy Authentication Required" for an http URL. Only the transport knows (from
// HTTPS_PROXY, HTTP_PROXY and NO_PROXY, for DefaultTransport), so it is asked again,
// on failures only. The proxy's user name and password are not shown.
func (c *Connector) via(req *http.Request) string {
	t, ok := c.transport.(*http.Transport)
	if !ok || t.Proxy == nil || req == nil {
		return ""
	}
	proxy, err := t.Proxy(req)
	if err != nil || proxy == nil {
		return ""
	}
	return " (through the proxy " + connectors.RedactEndpoint(proxy.String()) + ")"
}

// classify turns an answer into nil or a classified error.
func (c *Connector) classify(resp *http.Response, excerpt string) error {
	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		return nil
	}
	answered := fmt.Sprintf("POST %s%s: receiver answered %s", c.target, c.via(resp.Request), connectors.StatusText(code))
	if q := connectors.Excerpt(excerpt, maxErrorExcerpt); q != "" {
		answered += ": " + q
	}
	switch {
	case code == http.StatusSeeOther:
		// 303 answers a request the server took, pointing elsewhere for its outcome: the
		// receiver may well have acted, so the row is not one to replay blindly.
		return connectors.Ambiguous(connectors.Permanent(fmt.Errorf(
			"%s (the receiver took the request and points elsewhere for its outcome, not followed); it may have acted: check it before replaying the row", answered)))
	case code >= 300 && code <= 399:
		where := ""
		if loc, err := resp.Location(); err == nil {
			// As the configured URL is shown: the redirect may repeat its token.
			where = " to " + connectors.RedactEndpoint(loc.String())
		}
		return connectors.Permanent(fmt.Errorf("%s (a redirect%s, not followed); configure the final URL instead", answered, where))
	case connectors.RetryableStatus(code):
		err := errors.New(answered)
		if d, ok := connectors.RetryAfterOf(resp.Header, c.now()); ok {
			err = connectors.RetryAfter(err, d)
		}
		if connectors.GatewayLostAnswer(code) {
			// A gateway answered for the receiver: it passed the request on and then lost
			// the receiver's connection (502, 520) or stopped waiting for its answer (504,
			// 524). The receiver may have acted, as after a connection reset of its own.
			return connectors.Ambiguous(fmt.Errorf("%w (a gateway's answer: the receiver may have acted)", err))
		}
		return err
	default: // other 4xx, and codes outside the classes HTTP defines
		return connectors.Permanent(errors.New(answered))
	}
}

// answerBody returns resp's body to read the answer from: decompressed when it says it
// is gzip and starts as gzip does (a receiver that compresses whether or not it was
// asked), else as sent, so that an answer whose Content-Encoding says gzip but that is
// not (a lying header, a proxy that decompressed it and kept the header) is still read.
// Other codings are read as sent. A transport that decompressed the answer itself has
// removed the header.
func answerBody(resp *http.Response) io.Reader {
	coding := resp.Header.Get("Content-Encoding")
	if coding == "" || !strings.EqualFold(coding, "gzip") && !strings.EqualFold(coding, "x-gzip") {
		return resp.Body
	}
	br := bufio.NewReader(resp.Body)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		if zr, err := gzip.NewReader(br); err == nil {
			return zr
		}
	}
	return br
}

// excerptBufs keep readExcerpt's buffers between attempts.
var excerptBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readExcerpt reads up to limit bytes of body and returns them as valid UTF-8 (invalid
// bytes become U+FFFD while it fits, and a rune cut at the end is dropped), reporting
// whether anything was left out.
func readExcerpt(body io.Reader, limit int) (string, bool) {
	read := excerptBufs.Get().(*bytes.Buffer)
	defer excerptBufs.Put(read)
	read.Reset()
	_, err := read.ReadFrom(io.LimitReader(body, int64(limit)+1))
	buf := read.Bytes()
	// cut: the body goes on past buf (the limit, or a read that failed part-way), so
	// a rune unfinished at its end may be one the cut split.
	cut := err != nil || len(buf) > limit
	truncated := cut
	buf = buf[:min(len(buf), limit)]
	if utf8.Valid(buf) {
		return string(buf), truncated
	}
	var b strings.Builder
	for len(buf) > 0 {
		r, size := utf8.DecodeRune(buf)
		if r == utf8.RuneError && size == 1 && cut && !utf8.FullRune(buf) {
			break // a rune cut by the limit; a body that ends in half of one was not cut
		}
		n := size
		if r == utf8.RuneError && size == 1 {
			n = utf8.RuneLen(utf8.RuneError)
		}
		if b.Len()+n > limit {
			truncated = true
			break
		}
		b.WriteRune(r)
		buf = buf[size:]
	}
	return b.String(), truncated
}

// validHeader reports whether name is an HTTP token and value has no control
// characters other than tab, so the request is well-formed.
func validHeader(name, value string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		ch := name[i]
		if ch <= ' ' || ch >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, ch) >= 0 {
			return false
		}
	}
	return connectors.ValidHeaderValue(value)
}
