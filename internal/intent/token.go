package intent

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/outbox"
)

// Sentinel errors; test for them with errors.Is. Errors of the outbox package
// (outbox.ErrNotFound, outbox.ErrKeyConflict, outbox.ErrInvalidMessage) pass through
// wrapped.
var (
	// ErrUnauthorized means the bearer token is missing or matches no configured token.
	ErrUnauthorized = errors.New("missing or unknown API token")

	// ErrForbidden means the token may not do this: a connector outside its list, or a
	// decision that needs an admin token.
	ErrForbidden = errors.New("forbidden for this token")
)

// tokenPrefix starts every secret [NewToken] makes, so a leaked one is recognisable.
const tokenPrefix = "obx_"

// Token is one configured API token: an entry of OUTBOX_API_TOKENS.
type Token struct {
	// Name identifies the token in created_by and the audit trail. Unique.
	Name string `json:"name"`
	// SHA256 is the hex SHA-256 of the secret; the secret itself is never stored.
	SHA256 string `json:"sha256"`
	// Connectors are the connector instances the token may use: "webhook",
	// "webhook:crm", "webhook:*" (every instance of the kind) or "*" (all).
	Connectors []string `json:"connectors"`
	// Admin lets the token approve, reject and cancel intents.
	Admin bool `json:"admin"`
}

// Allows reports whether the token may use connector, an instance name such as
// "webhook" or "webhook:crm".
func (t *Token) Allows(connector string) bool {
	if t == nil || connector == "" {
		return false
	}
	kind, _, _ := strings.Cut(connector, ":")
	for _, c := range t.Connectors {
		if c == "*" || c == connector || c == kind+":*" {
			return true
		}
	}
	return false
}

// all reports whether the token may use every connector.
func (t *Token) all() bool {
	for _, c := range t.Connectors {
		if c == "*" {
			return true
		}
	}
	return false
}

// Policy is who may do what: the configured tokens and the connectors whose API
// intents need an approval.
type Policy struct {
	// Tokens are the configured tokens, as [ParseTokens] returns them.
	Tokens []Token
	// ApprovalRequired names connector instances ("payment:eu") whose intents start
	// awaiting_approval; a plain kind ("payment") or "kind:*" covers all its instances.
	ApprovalRequired []string
}

// requiresApproval reports whether intents for connector start awaiting_approval.
func (p *Policy) requiresApproval(connector string) bool {
	kind, _, _ := strings.Cut(connector, ":")
	for _, a := range p.ApprovalRequired {
		if a == connector || a == kind || a == kind+":*" || a == "*" {
			return true
		}
	}
	return false
}

// Bearer returns the token of an "Authorization: Bearer <token>" header, or "". The
// scheme is matched without regard to case, and the header split as the MCP SDK's
// middleware splits it, so the intent API and the MCP endpoint accept the same headers.
func Bearer(r *http.Request) string {
	fields := strings.Fields(r.Header.Get("Authorization"))
	if len(fields) != 2 || !strings.EqualFold(fields[0], "bearer") {
		return ""
	}
	return fields[1]
}

// Authenticate returns the token whose hash is the SHA-256 of bearer, or an error
// wrapping [ErrUnauthorized]. It compares against every token in constant time, so the
// answer's timing does not tell how much of a hash matched.
func (p *Policy) Authenticate(bearer string) (*Token, error) {
	if bearer == "" {
		return nil, fmt.Errorf("%w: send Authorization: Bearer <token>", ErrUnauthorized)
	}
	sum := sha256.Sum256([]byte(bearer))
	got := []byte(hex.EncodeToString(sum[:]))
	found := -1
	for i := range p.Tokens {
		if subtle.ConstantTimeCompare(got, []byte(p.Tokens[i].SHA256)) == 1 && found < 0 {
			found = i
		}
	}
	if found < 0 {
		return nil, fmt.Errorf("%w: the bearer token matches no configured token", ErrUnauthorized)
	}
	return &p.Tokens[found], nil
}

// NewToken returns a fresh random secret ("obx_" and 32 random bytes in base64url) and
// the hex SHA-256 to configure in OUTBOX_API_TOKENS.
func NewToken() (secret string, sha256hex string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("new token: %w", err)
	}
	secret = tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(secret))
	return secret, hex.EncodeToString(sum[:]), nil
}

var (
	hashPattern    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	patternPattern = regexp.MustCompile(`^(\*|[a-z][a-z0-9_]*(:([a-z0-9_]+|\*))?)$`)
)

// ParseTokens reads OUTBOX_API_TOKENS: a JSON array of tokens. Empty text means no
// tokens. Each token needs a unique name, a hex SHA-256 (normalised to lowercase) and at
// least one well-formed connector, and gives each field once; the error joins one error
// per problem.
func ParseTokens(jsonText string) ([]Token, error) {
	if strings.TrimSpace(jsonText) == "" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(jsonText)))
	dec.DisallowUnknownFields()
	var tokens []Token
	if err := dec.Decode(&tokens); err != nil {
		return nil, fmt.Errorf("tokens are not a JSON array of {name, sha256, connectors, admin}: %w", err)
	}
	if dec.More() {
		return nil, errors.New("tokens: unexpected data after the JSON array")
	}
	// The same array again, each entry as written, for what decoding hides (repeatedField).
	var entries []json.RawMessage
	if err := json.Unmarshal([]byte(jsonText), &entries); err != nil || len(entries) != len(tokens) {
		return nil, errors.New("tokens: the JSON array could not be read a second time") // it decoded above
	}
	var errs []error
	seen := make(map[string]bool, len(tokens))
	hashes := make(map[string]string, len(tokens)) // sha256 -> the first token's label
	for i := range tokens {
		t := &tokens[i]
		label := fmt.Sprintf("token %d", i)
		if t.Name != "" {
			label = fmt.Sprintf("token %q", t.Name)
		}
		if field, first, again := repeatedField(entries[i]); field != "" {
			// encoding/json keeps the last: "admin": false where a reviewer looks could
			// be followed by "Admin": true.
			errs = append(errs, fmt.Errorf("%s: field %q is given more than once (as %q and %q) and only the last would count; give it once",
				label, field, first, again))
		}
		switch {
		case strings.TrimSpace(t.Name) == "":
			errs = append(errs, fmt.Errorf("%s: name is empty", label))
		case strings.ContainsRune(t.Name, 0):
			// PostgreSQL's text takes no NUL: every intent the token made was refused as
			// invalid (its created_by), and every decision it took failed in the audit trail.
			errs = append(errs, fmt.Errorf("%s: name must not contain a NUL character (\\u0000)", label))
		case seen[t.Name]:
			errs = append(errs, fmt.Errorf("%s: name is used by another token; names must be unique", label))
		}
		seen[t.Name] = true
		t.SHA256 = strings.ToLower(t.SHA256)
		if !hashPattern.MatchString(t.SHA256) {
			errs = append(errs, fmt.Errorf("%s: sha256 must be 64 hex digits (the SHA-256 of the token; `outboxd token new` prints it)", label))
		} else if first, dup := hashes[t.SHA256]; dup {
			// One secret would act as whichever entry comes first, whatever its scope.
			errs = append(errs, fmt.Errorf("%s: sha256 is also %s's; each token needs its own secret", label, first))
		} else {
			hashes[t.SHA256] = label
		}
		if len(t.Connectors) == 0 {
			errs = append(errs, fmt.Errorf("%s: connectors is empty; name the instances it may use (webhook, webhook:crm, webhook:*, or *)", label))
		}
		for _, c := range t.Connectors {
			switch kind, _, _ := strings.Cut(c, ":"); {
			case !patternPattern.MatchString(c):
				errs = append(errs, fmt.Errorf("%s: connector %q is malformed; use kind, kind:name, kind:* or *", label, c))
			case c != "*" && !slices.Contains(outbox.Kinds, kind):
				// It would match no intent: the token would be refused, with a 403, for the
				// connector meant ("webhok" for webhook), and nothing said at start.
				errs = append(errs, fmt.Errorf("%s: connector %q is of no known kind (%s)", label, c, strings.Join(outbox.Kinds, ", ")))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return tokens, nil
}

// tokenFields are the JSON names of a [Token]'s fields.
var tokenFields = []string{"name", "sha256", "connectors", "admin"}

// repeatedField returns the first field of a [Token] that the JSON object entry gives
// twice, and the two names it is given as, matched as encoding/json matches them (without
// regard to case, with Unicode folding, as strings.EqualFold does); field is "" when each
// is given once.
func repeatedField(entry json.RawMessage) (field, first, again string) {
	dec := json.NewDecoder(bytes.NewReader(entry))
	if _, err := dec.Token(); err != nil { // the '{': ParseTokens decoded entry already
		return "", "", ""
	}
	given := make(map[string]string, len(tokenFields)) // field -> the name it was given as
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", "", ""
		}
		name, _ := t.(string)
		if err := dec.Decode(new(json.RawMessage)); err != nil {
			return "", "", ""
		}
		i := slices.IndexFunc(tokenFields, func(f string) bool { return strings.EqualFold(f, name) })
		if i < 0 {
			continue // unknown: the decoder refused it
		}
		if prev, ok := given[tokenFields[i]]; ok {
			return tokenFields[i], prev, name
		}
		given[tokenFields[i]] = name
	}
	return "", "", ""
}
