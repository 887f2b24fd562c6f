package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/outboxd/outboxd/internal/intent"
)

// sessionIdle closes an HTTP session that has seen no request for this long, so
// clients that vanish do not hold sessions forever.
const sessionIdle = 30 * time.Minute

// tokenExtra is the key of the [intent.Token] in [auth.TokenInfo.Extra].
const tokenExtra = "outboxd_token"

// ctxTokenKey carries the token from the authenticating middleware to the SDK's
// bearer-token verifier.
type ctxTokenKey struct{}

// Handler returns the streamable-HTTP MCP endpoint (mount it at /mcp). Every request
// needs Authorization: Bearer <token>, authenticated with svc.Policy; without a valid
// one the answer is 401 with the JSON error shape of the intent API. Tool calls act as
// the request's token, and a session stays bound to the token name that opened it
// (another token using its session id gets 403).
func Handler(svc *intent.Service, cfg *Config) http.Handler {
	c := cfg.withDefaults()
	s := New(svc, tokenFromRequest, &c)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{
			Logger: c.Logger.With("component", "mcp_http"), SessionTimeout: sessionIdle,
			// The SDK's DNS rebinding check refuses a request that reaches a loopback
			// address with another Host: every request a reverse proxy on the same host
			// forwards to outboxd serve's default 127.0.0.1 with the public Host (Caddy,
			// nginx with Host $host, a sidecar), while the intent API answers them. What
			// keeps a rebinding page out is the bearer token every request needs, which a
			// browser does not send for it.
			DisableLocalhostProtection: true,
		})
	// The SDK's middleware is what puts a TokenInfo where tool calls can read it
	// (RequestExtra.TokenInfo) and binds sessions to its UserID. Its verifier only
	// picks up the token authenticated below, so the secret is hashed once.
	verify := func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		tok, ok := r.Context().Value(ctxTokenKey{}).(*intent.Token)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: tok.Name, Extra: map[string]any{tokenExtra: tok}}, nil
	}
	protected := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, err := svc.Policy.Authenticate(intent.Bearer(r))
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", err.Error())
			return
		}
		if r.Method == http.MethodPost {
			// A JSON-RPC batch (protocol 2025-03-26 and earlier) would run many tool
			// calls in one request, past the token's per-request rate limit: refused.
			body, err := io.ReadAll(r.Body)
			if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
				// Answered here, not by the SDK, whose plain-text 413 answers no request:
				// its client took the connection for broken and closed the agent's
				// session, failing every later call, over one payload too large.
				writeTooLarge(w, body, tooLarge.Limit)
				return
			}
			if err == nil && bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("[")) {
				writeError(w, http.StatusBadRequest, "batch_not_supported",
					"JSON-RPC batches are not accepted: send one message per request")
				return
			}
			// The SDK reads what was read, then the read's error (a client gone mid-body).
			r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
		}
		protected.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxTokenKey{}, tok)))
	})
}

// tokenFromRequest is the [TokenFunc] of HTTP sessions: the token [Handler]
// authenticated for the request.
func tokenFromRequest(_ context.Context, req *mcp.CallToolRequest) (*intent.Token, error) {
	if req != nil && req.Extra != nil && req.Extra.TokenInfo != nil {
		if tok, ok := req.Extra.TokenInfo.Extra[tokenExtra].(*intent.Token); ok {
			return tok, nil
		}
	}
	return nil, fmt.Errorf("%w: the request carried no authenticated token", intent.ErrUnauthorized)
}

// writeError writes the intent API's error shape: {"error": {"code", "message"}}.
func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": message}})
}

// writeTooLarge answers a request whose body is over limit: 413 with a JSON-RPC error
// response, as the transport allows, for the request whose start is read. A client
// matches it to its call by the id (the SDK's client needs one), which fails that call
// alone and leaves the session open.
func writeTooLarge(w http.ResponseWriter, read []byte, limit int64) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"jsonrpc": "2.0",
		"id":      requestID(read),
		"error": map[string]any{
			"code": -32600, // invalid request
			"message": fmt.Sprintf("the request is over the limit of %d bytes (OUTBOX_API_MAX_BODY), so it was not read and nothing was written: "+
				"send less, such as a smaller payload, or ask an operator to raise the limit", limit),
		},
	})
}

// requestID returns the id of the JSON-RPC request that read begins, when it comes
// before the body was cut (the SDK's client writes it before the params), or null.
func requestID(read []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(read))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return json.RawMessage("null")
	}
	for dec.More() {
		name, err := dec.Token()
		if err != nil {
			break
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			break // the value the body was cut in
		}
		if name == "id" { // matched exactly, as the SDK matches message fields
			if len(value) > 0 && (value[0] == '"' || value[0] == '-' || ('0' <= value[0] && value[0] <= '9')) {
				return value
			}
			break
		}
	}
	return json.RawMessage("null")
}

// errReader returns err, or io.EOF when err is nil.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}
