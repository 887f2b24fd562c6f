// Package api is the intent HTTP API of `outboxd serve`: a thin JSON face over an
// [intent.Service], which holds the policy.
//
// # Routes
//
//   - POST /v1/intents creates an intent. Authorization: Bearer <token> and
//     Idempotency-Key: <key> (1 to 255 characters) are required; the body is
//     {"connector", "payload", "ordering_key", "not_before"}. A new key answers 201, the
//     same request again 200 with Idempotent-Replayed: true and the intent as it is now,
//     a different request under a used key 422.
//   - GET /v1/intents/{key} reads one intent (404 when unknown, outside the token's
//     connectors, or deleted after OUTBOX_RETENTION), with copy_of and replayed_as when an
//     operator re-executed its operation under a new key (outboxd replay --new-key), and
//     may_have_acted when it was canceled, or went dead, after an attempt that may have
//     reached the receiver. The list and a create answered again carry them too.
//   - GET /v1/intents?status=&connector=&limit=&after= lists the token's intents, newest
//     first; status may repeat or be comma-separated, limit is a positive integer (a page
//     holds at most 1000), after is the previous page's next. Another parameter, or one
//     that does not parse, answers 400.
//   - POST /v1/intents/{key}/approve, /reject and /cancel decide (admin tokens only),
//     with an optional body {"reason": "..."}, and answer the intent as GET does. A cancel's answer
//     also has "may_have_acted": {"connector", "reason"} when an attempt of the intent
//     may have reached the receiver, which may have acted already.
//
// Another method on one of these paths answers 405 with Allow; any other path, 404.
//
// Errors are JSON {"error": {"code": "...", "message": "..."}}. Each token is rate
// limited on its own ([Config.Rate]); a limited request answers 429 with Retry-After. A
// request the database does not answer within [Config.CallTimeout], or that finds it
// down, or whose transaction it ends on a conflict with concurrent work, answers 503.
// Tokens never appear in logs: requests are logged with the token's name.
package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// DefaultMaxBody is the default request body limit, 1 MiB.
const DefaultMaxBody = 1 << 20

// maxKeyLength is the longest Idempotency-Key, in characters, as outbox allows.
const maxKeyLength = outbox.MaxKeyLength

// Config configures a [Handler].
type Config struct {
	// Rate is how many requests per second each token may make, with a burst of
	// max(1, Rate). Zero or less means no limit (OUTBOX_API_RATE=0).
	Rate float64
	// MaxBody is the largest request body, in bytes. Defaults to 1 MiB.
	MaxBody int64
	// Logger receives one debug line per request and the errors. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// CallTimeout bounds the database work of one request, so a database that does not
	// answer gives the client a 503 instead of a request that never ends (pgx waits on a
	// connection without a deadline of its own). Defaults to 20s, within the HTTP
	// server's 30s write timeout.
	CallTimeout time.Duration
}

// DefaultCallTimeout is the default of [Config.CallTimeout].
const DefaultCallTimeout = 20 * time.Second

// errCallTimeout is the cause of a request's context ending at [Config.CallTimeout].
var errCallTimeout = errors.New("intent api request timed out")

// bound returns ctx limited by [Config.CallTimeout], for a route's database work once its
// body is read (a slow upload is the HTTP server's ReadTimeout's business), and done,
// which ends it: done(err) is err, wrapped in errCallTimeout when the database did not
// answer in time.
func (h *Handler) bound(ctx context.Context) (context.Context, func(error) error) {
	ctx, cancel := context.WithTimeoutCause(ctx, h.cfg.CallTimeout, errCallTimeout)
	return ctx, func(err error) error {
		defer cancel()
		if err != nil && errors.Is(context.Cause(ctx), errCallTimeout) {
			return fmt.Errorf("%w: %w", errCallTimeout, err)
		}
		return err
	}
}

// Handler serves the intent API. Mount it on "/v1/".
type Handler struct {
	svc     *intent.Service
	cfg     Config
	mux     *http.ServeMux
	mu      sync.Mutex
	limiter map[string]*rate.Limiter // by token name
}

// New returns a Handler for svc.
func New(svc *intent.Service, cfg *Config) *Handler {
	c := *cfg
	c.MaxBody = cmp.Or(max(c.MaxBody, 0), DefaultMaxBody)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	h := &Handler{svc: svc, cfg: c, mux: http.NewServeMux(), limiter: map[string]*rate.Limiter{}}
	h.mux.Handle("POST /v1/intents", h.auth(h.create))
	h.mux.Handle("GET /v1/intents", h.auth(h.list))
	h.mux.Handle("GET /v1/intents/{key}", h.auth(h.get))
	h.mux.Handle("POST /v1/intents/{key}/approve", h.auth(h.decide(neverSent(svc.Approve))))
	h.mux.Handle("POST /v1/intents/{key}/reject", h.auth(h.decide(neverSent(svc.Reject))))
	h.mux.Handle("POST /v1/intents/{key}/cancel", h.auth(h.decide(svc.Cancel)))
	h.mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		// This catch-all matches every method, so the mux never answers 405 itself.
		// The path is named as sent: decoded, /v1/intents/k%2Fapprove (the intent
		// "k/approve") would read as the approve route.
		if allow := h.allowed(r); allow != "" {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed",
				r.Method+" is not allowed on "+r.URL.EscapedPath()+"; use "+allow)
			return
		}
		writeError(w, http.StatusNotFound, "not_found", "no such route: "+r.Method+" "+r.URL.EscapedPath())
	})
	return h
}

// allowed returns the methods that a route accepts at r's path, such as "GET, HEAD",
// or "" when no route has the path.
func (h *Handler) allowed(r *http.Request) string {
	var methods []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
		if _, pattern := h.mux.Handler(&http.Request{Method: m, URL: r.URL, Host: r.Host}); pattern != "/v1/" {
			methods = append(methods, m)
		}
	}
	return strings.Join(methods, ", ")
}

// ServeHTTP serves one request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// handlerFunc is a route, called with the authenticated token.
type handlerFunc func(w http.ResponseWriter, r *http.Request, tok *intent.Token) error

// auth authenticates the bearer token, applies the token's rate limit, runs next and
// answers its error. It logs the token's name, never the token.
func (h *Handler) auth(next handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		name := ""
		defer func() {
			h.cfg.Logger.DebugContext(r.Context(), "intent api request",
				"method", r.Method, "path", r.URL.Path, "status", sw.status, "token", name)
		}()
		tok, err := h.svc.Policy.Authenticate(intent.Bearer(r))
		if err != nil {
			h.fail(sw, r, err)
			return
		}
		name = tok.Name
		if !h.admit(sw, tok.Name) {
			return
		}
		if err := next(sw, r, tok); err != nil {
			h.fail(sw, r, err)
		}
	})
}

// Limit gives another handler of the same tokens (the MCP endpoint) the API's limits:
// each token's rate limit, shared with its API requests, and the body limit. A request
// without a valid token passes through for next to refuse.
func (h *Handler) Limit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, h.cfg.MaxBody)
		if tok, err := h.svc.Policy.Authenticate(intent.Bearer(r)); err == nil && !h.admit(w, tok.Name) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// admit takes one request from the token's rate limit, or answers 429 and reports false.
func (h *Handler) admit(w http.ResponseWriter, name string) bool {
	wait, ok := h.allow(name)
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(wait))
		writeError(w, http.StatusTooManyRequests, "rate_limited",
			fmt.Sprintf("token %q is over its rate limit; retry after %d s", name, wait))
	}
	return ok
}

// allow takes one request from the token's rate limit, or says how many whole seconds
// to wait.
func (h *Handler) allow(name string) (retryAfter int, ok bool) {
	if h.cfg.Rate <= 0 {
		return 0, true
	}
	h.mu.Lock()
	lim, found := h.limiter[name]
	if !found {
		lim = rate.NewLimiter(rate.Limit(h.cfg.Rate), max(1, int(h.cfg.Rate)))
		h.limiter[name] = lim
	}
	h.mu.Unlock()
	now := time.Now()
	res := lim.ReserveN(now, 1)
	if !res.OK() {
		return 1, false
	}
	delay := res.DelayFrom(now)
	if delay == 0 {
		return 0, true
	}
	res.CancelAt(now) // a refused request does not use up the budget
	return max(1, int(math.Ceil(delay.Seconds()))), false
}

// createBody is POST /v1/intents's body.
type createBody = intent.CreateRequest

// parseCreate decodes a create body: one JSON object, no unknown fields, nothing after.
func parseCreate(body []byte) (intent.CreateRequest, error) {
	var req createBody
	if err := decodeStrict(body, &req); err != nil {
		return intent.CreateRequest{}, err
	}
	if len(req.Payload) > 0 && bytes.Equal(bytes.TrimSpace(req.Payload), []byte("null")) {
		req.Payload = nil
	}
	return req, nil
}

// errBadRequest marks a request the client must fix before sending again.
var errBadRequest = errors.New("bad request")

func decodeStrict(body []byte, v any) error {
	if err := connectors.DecodeExact(body, v); err != nil {
		return fmt.Errorf("%w: the body is not a valid JSON object of this request: %v", errBadRequest, err)
	}
	return nil
}

// readBody reads the body up to the limit.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, errTooLarge{limit: tooBig.Limit}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading the body: %v", errBadRequest, err)
	}
	return b, nil
}

type errTooLarge struct{ limit int64 }

func (e errTooLarge) Error() string {
	return fmt.Sprintf("the body is over the limit of %d bytes (OUTBOX_API_MAX_BODY)", e.limit)
}

// idempotencyKey reads and checks the Idempotency-Key header.
func idempotencyKey(r *http.Request) (string, error) {
	key := r.Header.Get("Idempotency-Key")
	switch n := utf8.RuneCountInString(key); {
	case len(r.Header.Values("Idempotency-Key")) > 1:
		return "", fmt.Errorf("%w: send one Idempotency-Key header; this request has %d", errBadRequest, len(r.Header.Values("Idempotency-Key")))
	case key == "":
		return "", fmt.Errorf("%w: the Idempotency-Key header is required: derive it from the decision and reuse it on every retry", errBadRequest)
	case n > maxKeyLength:
		return "", fmt.Errorf("%w: the Idempotency-Key header is %d characters; the limit is %d", errBadRequest, n, maxKeyLength)
	case !utf8.ValidString(key) || strings.ContainsRune(key, 0):
		return "", fmt.Errorf("%w: the Idempotency-Key header must be valid UTF-8 without NUL", errBadRequest)
	}
	return key, nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, tok *intent.Token) error {
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	body, err := h.readBody(w, r)
	if err != nil {
		return err
	}
	req, err := parseCreate(body)
	if err != nil {
		return err
	}
	ctx, done := h.bound(r.Context())
	in, err := h.svc.Propose(ctx, tok, key, req)
	if errors.Is(err, intent.ErrPathlessKey) {
		_ = done(nil) // ends the bound
		return fmt.Errorf("%w: the Idempotency-Key %q cannot be named in a URL path (GET /v1/intents/{key}); use another key", errBadRequest, key)
	}
	answer := []intentAnswer{{Intent: ops.WithoutCredentials(in)}}
	if err == nil && !in.Inserted {
		// The same request again is answered with the intent as it is now, which an
		// operator may have re-executed under a new key, or canceled, since: answered as
		// GET answers it.
		answer, err = h.answers(ctx, tok, []outbox.Intent{in})
	}
	err = done(err)
	if errors.Is(err, outbox.ErrKeyConflict) {
		return keyConflict{key: key, err: err}
	}
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if !in.Inserted {
		status = http.StatusOK
		w.Header().Set("Idempotent-Replayed", "true")
	}
	return writeJSON(w, status, answer[0])
}

type keyConflict struct {
	key string
	err error
}

func (e keyConflict) Error() string {
	return fmt.Sprintf("idempotency key %q was already used for a different request (connector, payload or ordering key); "+
		"read the intent with GET /v1/intents/{key}, or use a new key for a new decision", e.key)
}

func (e keyConflict) Unwrap() error { return e.err }

// intentAnswer is an intent as the API answers it (GET /v1/intents/{key}, each of a
// listing's, a create's again, a decision's): the intent, and the copies that replay --new-key made of
// its operation (intent.Copies). Without replayed_as, a row whose operation an operator
// re-executed under a new key reads dead for good, and a client takes the operation for
// failed, and may act again.
//
// A canceled intent an attempt of which may have reached the receiver names why in
// may_have_acted, as the cancel answered it (intent.Service.MayHaveActed): "canceled"
// alone reads as an operation that never happened, and the client that lost the cancel's
// answer, or another one, asks GET. So does a dead one: "dead" alone reads as an
// operation that failed, and a client acts again under a new key.
type intentAnswer struct {
	outbox.Intent
	CopyOf       string       `json:"copy_of,omitempty"`
	ReplayedAs   *intent.Copy `json:"replayed_as,omitempty"`
	MayHaveActed *ops.Reached `json:"may_have_acted,omitempty"`
}

// answers are the answers of ins, in their order, as tok may read them: each with its
// copies and, canceled or dead, why the receiver may have acted. A page of ins asks the
// database no more than one of them does.
func (h *Handler) answers(ctx context.Context, tok *intent.Token, ins []outbox.Intent) ([]intentAnswer, error) {
	notes, err := h.svc.Notes(ctx, tok, ins)
	if err != nil {
		return nil, err
	}
	out := make([]intentAnswer, 0, len(ins))
	for _, in := range ins {
		c, acted := notes.Of(in.Key)
		out = append(out, intentAnswer{Intent: ops.WithoutCredentials(in), CopyOf: c.CopyOf, ReplayedAs: c.ReplayedAs, MayHaveActed: acted})
	}
	return out, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, tok *intent.Token) error {
	ctx, done := h.bound(r.Context())
	in, err := h.svc.Get(ctx, tok, r.PathValue("key"))
	var answer []intentAnswer
	if err == nil {
		answer, err = h.answers(ctx, tok, []outbox.Intent{in})
	}
	if err = done(err); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, answer[0])
}

// listParams are the query parameters of GET /v1/intents.
var listParams = []string{"status", "connector", "limit", "after"}

// listQuery reads the query of GET /v1/intents as strictly as a create's body: a pair
// that does not parse (a ';' separator, a bad %-escape), an unknown name (a typo) or a
// parameter other than status given twice with different values is refused. url.Values
// drops or picks among these without a word, and the listing went on without that
// filter: ?status=dead;pending or ?state=dead listed every intent.
func listQuery(r *http.Request) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: the query does not parse (separate parameters with '&'): %v", ops.ErrInvalidFilter, err)
	}
	for name, vs := range q {
		if !slices.Contains(listParams, name) {
			return nil, fmt.Errorf("%w: unknown query parameter %q; use %s", ops.ErrInvalidFilter, name, strings.Join(listParams, ", "))
		}
		if name != "status" && slices.ContainsFunc(vs, func(v string) bool { return v != vs[0] }) {
			return nil, fmt.Errorf("%w: query parameter %q is given %d times with different values; give it once", ops.ErrInvalidFilter, name, len(vs))
		}
	}
	return q, nil
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, tok *intent.Token) error {
	q, err := listQuery(r)
	if err != nil {
		return err
	}
	f := ops.Filter{Connector: q.Get("connector"), After: q.Get("after")}
	for _, s := range q["status"] {
		for part := range strings.SplitSeq(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				f.Status = append(f.Status, part)
			}
		}
	}
	if l := q.Get("limit"); l != "" {
		// Past the largest int, Atoi gives that int and ErrRange: a large page, which
		// List caps like any other.
		n, err := strconv.Atoi(l)
		if (err != nil && !errors.Is(err, strconv.ErrRange)) || n < 1 {
			return intent.LimitError(strconv.Quote(l))
		}
		f.Limit = n
	}
	ctx, done := h.bound(r.Context())
	page, err := h.svc.List(ctx, tok, f)
	out := listAnswer{Next: page.Next}
	if err == nil {
		out.Intents, err = h.answers(ctx, tok, page.Intents)
	}
	if err = done(err); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// listAnswer is GET /v1/intents's answer: a page of [ops.Page] whose intents are
// answered as GET /v1/intents/{key} answers them.
type listAnswer struct {
	Intents []intentAnswer `json:"intents"`
	Next    string         `json:"next,omitempty"`
}

// decideBody is the optional body of approve, reject and cancel.
type decideBody struct {
	Reason string `json:"reason"`
}

type decideFunc func(ctx context.Context, tok *intent.Token, key, reason string) (outbox.Intent, *ops.Reached, error)

// neverSent adapts approve and reject, which decide only about an intent awaiting
// approval, never attempted, so no receiver can have acted on it.
func neverSent(do func(ctx context.Context, tok *intent.Token, key, reason string) (outbox.Intent, error)) decideFunc {
	return func(ctx context.Context, tok *intent.Token, key, reason string) (outbox.Intent, *ops.Reached, error) {
		in, err := do(ctx, tok, key, reason)
		return in, nil, err
	}
}

func (h *Handler) decide(do decideFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, tok *intent.Token) error {
		body, err := h.readBody(w, r)
		if err != nil {
			return err
		}
		var b decideBody
		if len(bytes.TrimSpace(body)) > 0 {
			if err := decodeStrict(body, &b); err != nil {
				return err
			}
		}
		if strings.ContainsRune(b.Reason, 0) {
			// PostgreSQL's text cannot hold it: the audit row would fail, as a 500.
			return fmt.Errorf("%w: the reason must not contain a NUL character", errBadRequest)
		}
		ctx, done := h.bound(r.Context())
		in, acted, err := do(ctx, tok, r.PathValue("key"), b.Reason)
		var answer []intentAnswer
		if err == nil {
			// Answered as GET answers it: a held intent an operator re-executed under a new
			// key, then canceled, names its copy, where the operation goes on, or the
			// client takes "canceled" for the operation stopped.
			answer, err = h.answers(ctx, tok, []outbox.Intent{in})
		}
		if err = done(err); err != nil {
			return err
		}
		if acted != nil {
			// The cancel's own words: from the status it canceled ("held after an attempt").
			answer[0].MayHaveActed = acted
		}
		return writeJSON(w, http.StatusOK, answer[0])
	}
}

// fail answers err with its status and code; unexpected errors are logged and hidden.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var tooBig errTooLarge
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
	case errors.Is(err, errBadRequest):
		writeError(w, http.StatusBadRequest, "bad_request", strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
	case errors.Is(err, intent.ErrUnauthorized):
		w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
		writeError(w, http.StatusUnauthorized, "unauthorized", err.Error())
	case errors.Is(err, intent.ErrForbidden):
		writeError(w, http.StatusForbidden, "forbidden", err.Error())
	case errors.Is(err, outbox.ErrNotFound):
		// Not "never proposed": retention deletes finished rows, and a client that takes
		// a bare "no intent has key" so proposes it again has the receiver act again.
		writeError(w, http.StatusNotFound, "not_found", "no intent has key "+strconv.Quote(r.PathValue("key"))+
			" (or it belongs to a connector this token may not use); not found does not mean never proposed: "+
			"delivered and canceled intents are deleted after OUTBOX_RETENTION (168h by default), so one proposed before "+
			"may have been performed, and proposing it again under this key would be a new intent, which acts again")
	case errors.Is(err, outbox.ErrKeyConflict):
		writeError(w, http.StatusUnprocessableEntity, "key_conflict", err.Error())
	case errors.Is(err, outbox.ErrInvalidMessage):
		writeError(w, http.StatusUnprocessableEntity, "invalid_intent", err.Error())
	case errors.Is(err, intent.ErrConflictState):
		writeError(w, http.StatusConflict, "conflict_state", err.Error())
	case errors.Is(err, ops.ErrInvalidFilter):
		writeError(w, http.StatusBadRequest, "invalid_filter", err.Error())
	case r.Context().Err() != nil:
		// The client went away, or shutdown cut the request off: its transaction did
		// not commit, or committed (as GET /v1/intents/{key} shows), and no one reads
		// this answer. Not a fault of the server's, so not an error.
		h.cfg.Logger.InfoContext(r.Context(), "intent api request ended before it finished: the client went away or the server stopped",
			"method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable",
			"the request ended before it finished; sending the same request again (with the same Idempotency-Key) is safe")
	case intent.Unavailable(err):
		// The database is down or unreachable, or ended the session the request had (a
		// restart, a failover): worth saying, so the client retries later instead of
		// taking it for a fault of its request. The details stay in the log.
		h.cfg.Logger.ErrorContext(r.Context(), "intent api: database unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable",
			"the database is unavailable; sending the same request again later (with the same Idempotency-Key) is safe")
	case intent.Contended(err):
		// PostgreSQL ended the request's transaction on a conflict with concurrent work,
		// and the same request again may well succeed. Not "nothing was written": a
		// cancel reads the intent back in a transaction of its own after its write
		// committed. A 500 would read as a fault of the server's, which a client does not
		// retry.
		h.cfg.Logger.WarnContext(r.Context(), "intent api: the database ended the request's transaction on a conflict with concurrent work",
			"method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable",
			"the database ended the request's transaction on a conflict with concurrent work (a serialization failure or a deadlock); "+
				"sending the same request again (with the same Idempotency-Key) is safe")
	case errors.Is(err, errCallTimeout):
		h.cfg.Logger.ErrorContext(r.Context(), "intent api: the database did not answer", "method", r.Method, "path", r.URL.Path,
			"timeout", h.cfg.CallTimeout.String(), "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable", fmt.Sprintf(
			"the database did not answer within %s; sending the same request again later (with the same Idempotency-Key) is safe", h.cfg.CallTimeout))
	default:
		h.cfg.Logger.ErrorContext(r.Context(), "intent api", "method", r.Method, "path", r.URL.Path, "err", err)
		msg := "internal error; the server log has the details"
		if r.Method == http.MethodPost {
			// A create or a decision may have committed before what failed (reading the
			// intent back, answering it): told only "internal error", a client takes the
			// request for one that did nothing, and may act again under a new key.
			msg += "; whether the request took effect is unknown: sending the same request again " +
				"(with the same Idempotency-Key) is safe and answers what it did"
		}
		writeError(w, http.StatusInternalServerError, "internal", msg)
	}
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	_ = writeJSON(w, status, errorBody{Error: errorDetail{Code: code, Message: msg}}) // it always encodes
}

// writeJSON answers v as JSON with status. It encodes v before it writes anything, so a
// value that does not encode (a payload nested deeper than encoding/json goes, which
// jsonb takes from plain SQL) is an error for the caller to answer, not a 200 with an
// empty body.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode the answer: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n')) // the client went away; nothing to do
	return nil
}

// statusWriter remembers the status for the request log.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
