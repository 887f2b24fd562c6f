package config

import (
	"log/slog"
	"slices"
	"strings"

	"github.com/caarlos0/env/v11"

	"github.com/outboxd/outboxd/internal/intent"
)

// API configures the intent HTTP API and the MCP server.
type API struct {
	// TokensJSON is OUTBOX_API_TOKENS as given; [Load] parses it into Tokens.
	TokensJSON string `env:"OUTBOX_API_TOKENS" desc:"intent API tokens as JSON: [{\"name\":\"agent\",\"sha256\":\"<hex of token>\",\"connectors\":[\"webhook\",\"slack:*\"],\"admin\":false}]; empty turns the intent API off; outboxd token new makes entries"`
	// Tokens are the parsed tokens; empty when the intent API is off.
	Tokens []intent.Token `env:"-"`
	// ApprovalRequired names the connectors whose API and MCP intents start
	// awaiting_approval: instances, or a kind for all its instances.
	ApprovalRequired []string `env:"OUTBOX_APPROVAL_REQUIRED" desc:"connectors whose API and MCP intents start awaiting_approval, comma-separated instances, kinds, kind:* (every instance of the kind) or * (every connector), e.g. payment,webhook:crm"`
	// Rate is each token's request rate limit, per second, with a burst of
	// max(1, Rate). 0 turns it off.
	Rate float64 `env:"OUTBOX_API_RATE" envDefault:"10" desc:"requests per second each API token may make, to the intent API and /mcp together (burst the same, at least 1); 0 for no limit, else at least 1/3600 (one an hour)"`
	// MaxBody is the largest request body the intent API accepts, in bytes.
	MaxBody int64 `env:"OUTBOX_API_MAX_BODY" envDefault:"1048576" desc:"largest intent API or /mcp request body, in bytes"`
	// MCPToken is the token whose identity `outboxd mcp` (stdio) acts under.
	MCPToken Secret `env:"OUTBOX_MCP_TOKEN" desc:"the API token (secret) whose name and scope outboxd mcp acts under on stdio; one of OUTBOX_API_TOKENS"`
}

// LogValue shows whether the intent API (and /mcp) is on, and under which tokens: their
// names, connectors and whether they are admin, never their hashes.
func (a API) LogValue() slog.Value {
	if len(a.Tokens) == 0 {
		return slog.GroupValue(slog.Bool("enabled", false))
	}
	tokens := make([]string, len(a.Tokens))
	for i, t := range a.Tokens {
		tokens[i] = t.Name + "(" + strings.Join(t.Connectors, ",")
		if t.Admin {
			tokens[i] += ";admin"
		}
		tokens[i] += ")"
	}
	return slog.GroupValue(
		slog.Bool("enabled", true),
		slog.String("tokens", strings.Join(tokens, " ")),
		slog.String("approval_required", strings.Join(a.ApprovalRequired, ",")),
		slog.Float64("rate", a.Rate),
		slog.Int64("max_body", a.MaxBody),
	)
}

// String is LogValue's text: never the tokens' hashes.
func (a API) String() string { return a.LogValue().String() }

// GoString is String, so that %#v leaves the hashes out too.
func (a API) GoString() string { return a.String() }

// Policy returns the tokens and approval rules as an [intent.Policy].
func (a *API) Policy() *intent.Policy {
	return &intent.Policy{Tokens: a.Tokens, ApprovalRequired: a.ApprovalRequired}
}

// LoadAPI reads [API] from environ (as os.Environ returns it), for commands such as
// `outboxd mcp` that need the tokens but not the connectors.
func LoadAPI(environ []string) (API, error) {
	var p problems
	a := parseEnv[API](env.ToMap(environ), "", &p)
	a.validate(&p)
	return a, p.err()
}

// minAPIRate is the least positive OUTBOX_API_RATE: one request an hour.
const minAPIRate = 1.0 / 3600

func (a *API) validate(p *problems) {
	// Whether the tokens parsed and passed their checks: else OUTBOX_MCP_TOKEN cannot be
	// said to match none of them.
	tokensOK := p.ok("OUTBOX_API_TOKENS")
	if tokensOK {
		tokens, err := intent.ParseTokens(a.TokensJSON)
		if err != nil {
			tokensOK = false
			for _, e := range flatten(err) {
				p.addf("", "OUTBOX_API_TOKENS: %s", e.Error())
			}
		}
		a.Tokens = tokens
	}
	// Empty entries ("payment," or a blank value) are dropped, as in OUTBOX_CONNECTORS.
	a.ApprovalRequired = slices.DeleteFunc(a.ApprovalRequired, func(c string) bool { return strings.TrimSpace(c) == "" })
	for i, c := range a.ApprovalRequired {
		a.ApprovalRequired[i] = strings.TrimSpace(c)
		// A name that matches no connector would leave the gate open without a word.
		// "kind:*" and "*" are what the policy reads as every instance of the kind and
		// every connector, as a token's connectors are written.
		k, name, named := strings.Cut(a.ApprovalRequired[i], ":")
		if a.ApprovalRequired[i] == "*" {
			continue
		}
		if _, ok := knownKind(k); !ok || (named && name != "*" && !instanceName.MatchString(name)) {
			p.addf("", "OUTBOX_APPROVAL_REQUIRED: %q is not a connector kind (%s), kind:name with a lowercase name, "+
				"kind:* or *, so it would require approval of nothing", a.ApprovalRequired[i], kindNames())
		}
	}
	checkRate("OUTBOX_API_RATE", a.Rate, p) // NaN and +Inf would limit nothing
	if p.ok("OUTBOX_API_RATE") && a.Rate > 0 && a.Rate < minAPIRate {
		// 1e-9 allowed a token one request, then the next in 30 years: a typo for a
		// limit, or a way to switch a token off that revoking it does better.
		p.addf("OUTBOX_API_RATE", "OUTBOX_API_RATE must be 0 (no limit) or at least %.6f (one request an hour), got %v",
			minAPIRate, a.Rate)
	}
	if a.MaxBody <= 0 {
		p.addf("OUTBOX_API_MAX_BODY", "OUTBOX_API_MAX_BODY must be positive, got %d", a.MaxBody)
	}
	// A newline from a file or a Kubernetes secret would otherwise be reported as a
	// token matching none, though its hash is right.
	checkToken("OUTBOX_MCP_TOKEN", a.MCPToken, p)
	if a.MCPToken != "" && tokensOK && p.ok("OUTBOX_MCP_TOKEN") {
		if _, err := a.Policy().Authenticate(a.MCPToken.Reveal()); err != nil {
			p.addf("OUTBOX_MCP_TOKEN", "OUTBOX_MCP_TOKEN matches none of OUTBOX_API_TOKENS")
		}
	}
}
