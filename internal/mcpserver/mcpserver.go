package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// Tool names.
const (
	ToolPropose = "propose_intent"
	ToolGet     = "get_intent"
	ToolList    = "list_intents"
)

// instructions is what the server tells a client about itself when it connects.
const instructions = `outboxd delivers side effects (webhooks, emails, Slack messages, payments) exactly once per idempotency key. ` +
	`Never perform such an effect yourself: propose it with propose_intent, then follow it with get_intent. ` +
	`Derive the key from the decision (the same decision gives the same key; never include a time, an attempt number or a random value), ` +
	`reuse that key on every retry, and read the status with get_intent instead of proposing again. ` +
	`Some connectors wait for a person's approval (status awaiting_approval).`

const proposeDescription = `Propose a side effect (a webhook, email, Slack message or payment) for the outbox relay to perform exactly once.
Rules:
- Derive the key from the decision, not from the moment: pass key_parts such as [run id, step, target] and the server derives the key (or pass key). The same decision must give the same key; never include a time, an attempt number or a random value.
- Reuse the same key on every retry. Proposing the same decision again is harmless and returns the existing intent (replayed: true) as long as the outbox keeps it (delivered and canceled intents are deleted after its retention period, OUTBOX_RETENTION, 7 days by default; after that get_intent answers not found, and the same key is a new intent, which acts again); a different decision under a used key is an error.
- To learn what happened, call get_intent with the key instead of proposing again.
- Risky connectors (such as payment) may wait for a person's approval: status awaiting_approval. Do not work around it.
Give a short human-readable reason: it goes to this server's log with the key and comes back in the result, but it is not stored with the intent, so the person who approves it sees the connector and payload, not the reason.`

const getDescription = `Read one intent by its key: status (pending, delivering, delivered, dead, canceled, awaiting_approval, held), attempts, the last error and the receiver's stored result.
Call this instead of proposing again when you need to know whether a side effect happened; delivered means done, and the result is the receiver's answer.
Not found does not mean never proposed: delivered and canceled intents are deleted after the outbox's retention period (OUTBOX_RETENTION, 7 days by default), so a key you proposed before may name an effect that happened; do not propose it again to find out.
An intent that names replayed_as had its operation re-executed by an operator under that new key: while it is dead, held or canceled, that is where the operation went, so follow that key instead. copy_of names the intent whose operation a copy re-executes.
A canceled or dead intent that names may_have_acted ended after an attempt that may have reached the receiver: the effect may have happened; do not propose it again.`

const listDescription = `List intents newest first, only of the connectors this token may use. Filter by status (one, or several separated by commas) and connector; page with limit and the next cursor from the previous page (after).
An intent that names replayed_as had its operation re-executed by an operator under that new key, as get_intent says: follow that key rather than taking this intent's status (dead, held) as the operation's.`

// Config configures the MCP server. A nil *Config means all defaults.
type Config struct {
	// Logger receives one line per proposed intent (with the agent's reason) and the
	// internal errors the tools hide from the client. Defaults to discarding logs.
	Logger *slog.Logger
	// Version is the server version reported to clients. Defaults to "dev".
	Version string
	// CallTimeout bounds one tool call, so a database that does not answer gives the
	// agent a tool error instead of a call that never ends (pgx waits on a connection
	// without a deadline of its own). Defaults to 20s, within the HTTP server's 30s
	// write timeout.
	CallTimeout time.Duration
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if out.Version == "" {
		out.Version = "dev"
	}
	if out.CallTimeout <= 0 {
		out.CallTimeout = 20 * time.Second
	}
	return out
}

// TokenFunc returns the token a tool call acts as. An error fails the call as a tool
// error.
type TokenFunc func(ctx context.Context, req *mcp.CallToolRequest) (*intent.Token, error)

// ProposeInput is the input of propose_intent; its JSON schema is the tool's input
// schema.
type ProposeInput struct {
	Connector string   `json:"connector" jsonschema:"connector instance that performs the effect: webhook, email, slack, payment, or a named one such as webhook:crm"`
	Key       string   `json:"key,omitempty" jsonschema:"idempotency key naming this decision (1-255 characters); give key or key_parts"`
	KeyParts  []string `json:"key_parts,omitempty" jsonschema:"parts naming the decision, such as [run id, step, target], from which the server derives the key; never a time or an attempt number"`
	// Payload is decoded again from the raw arguments, so numbers keep their exact
	// text; the map type only gives the schema "object".
	Payload     map[string]any `json:"payload" jsonschema:"what the connector needs, as a JSON object (webhook: any object; email: to, subject, text or html; slack: channel, text or blocks; payment: operation and params)"`
	Reason      string         `json:"reason,omitempty" jsonschema:"why this effect is wanted, in a sentence a person understands; written to the server's log with the key, not stored with the intent"`
	OrderingKey string         `json:"ordering_key,omitempty" jsonschema:"intents sharing an ordering key are delivered one at a time, in the order proposed (a token scoped to some connectors has ordering keys of its own, shown as token:<name>/<key>, which names the same key when sent back)"`
	// NotBefore is parsed by propose rather than decoded as a time.Time, whose decoding
	// error would name this Go struct instead of saying what to send.
	NotBefore string `json:"not_before,omitempty" jsonschema:"do not perform it before this RFC 3339 time, such as 2030-01-02T15:04:05Z"`
}

// GetInput is the input of get_intent.
type GetInput struct {
	Key string `json:"key" jsonschema:"the intent's idempotency key, as propose_intent returned it"`
}

// ListInput is the input of list_intents.
type ListInput struct {
	Status    string    `json:"status,omitempty" jsonschema:"keep intents in this status, or in any of several separated by commas"`
	Connector string    `json:"connector,omitempty" jsonschema:"keep intents of this connector instance"`
	Limit     listLimit `json:"limit,omitempty" jsonschema:"page size, a positive integer; default 50; a page holds at most 1000, and a larger limit reads 1000"`
	After     string    `json:"after,omitempty" jsonschema:"the next cursor of the previous page"`
}

// listLimit is list_intents' limit. It takes any positive integer, as the intent API's
// limit does: one past the largest int is a large page, which the list caps at its
// largest, as it caps 5000. Decoded as an int, such a number (99999999999999999999, or
// 1e30, which the schema's "integer" takes too) failed the call with the decoder's
// "cannot unmarshal number 1e+30 into Go struct field ListInput.limit of type int",
// and a negative one with the list's "Limit: -1 is negative", both refusals that name
// Go rather than the argument and what it may be. Zero is the argument not given.
type listLimit int

// UnmarshalJSON reads the number as decodeArguments writes it again, once the schema
// has checked that it is an integer (a fraction never reaches it).
func (l *listLimit) UnmarshalJSON(b []byte) error {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f < 0 || f != math.Trunc(f) {
		return intent.LimitError(string(b))
	}
	// Capped before the conversion: past the largest int, a float64's conversion to int
	// is not defined (amd64 gives the smallest int, a negative page).
	*l = listLimit(min(f, ops.MaxListLimit))
	return nil
}

// Intent is an intent as the tools return it.
type Intent struct {
	Key           string     `json:"key"`
	Connector     string     `json:"connector"`
	Status        string     `json:"status"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error,omitempty"`
	Result        any        `json:"result,omitempty" jsonschema:"the receiver's stored answer"`
	Payload       any        `json:"payload,omitempty"`
	OrderingKey   string     `json:"ordering_key,omitempty"`
	CreatedBy     string     `json:"created_by,omitempty"`
	NextAttemptAt time.Time  `json:"next_attempt_at"`
	CreatedAt     time.Time  `json:"created_at"`
	DeliveredAt   *time.Time `json:"delivered_at,omitempty"`
}

func fromIntent(in outbox.Intent) Intent {
	out := Intent{
		Key: in.Key, Connector: in.Connector, Status: in.Status, Attempts: in.Attempts,
		LastError: in.LastError, OrderingKey: in.OrderingKey, CreatedBy: in.CreatedBy,
		NextAttemptAt: in.NextAttemptAt, CreatedAt: in.CreatedAt,
	}
	// A nil json.RawMessage in an interface would encode as null despite omitempty.
	if len(in.Result) > 0 {
		out.Result = in.Result
	}
	if len(in.Payload) > 0 {
		out.Payload = in.Payload
	}
	if !in.DeliveredAt.IsZero() {
		d := in.DeliveredAt
		out.DeliveredAt = &d
	}
	return out
}

// ProposeOutput is the output of propose_intent.
type ProposeOutput struct {
	Intent Intent `json:"intent"`
	// Inserted is true when this call wrote the intent.
	Inserted bool `json:"inserted"`
	// Replayed is true when the key already held this same decision: nothing new was
	// written.
	Replayed bool `json:"replayed"`
	// Operation names, for a decision proposed again, where an operator re-executed its
	// operation since, or that its cancel came after an attempt that may have reached the
	// receiver, as get_intent does: told only that it is dead or canceled, the agent
	// takes the operation for failed and may act again.
	Operation
	Reason string `json:"reason,omitempty"`
	// Message says in a sentence what happened and what to do next.
	Message string `json:"message"`
}

// Operation says what became of an intent's operation that its status alone does not:
// the copies an operator made to re-execute it under a new key (intent.Copies), and
// whether a canceled or dead intent's receiver may have acted already
// (intent.Service.MayHaveActed). It is in get_intent's output, a proposal's made again,
// and each intent of list_intents'.
type Operation struct {
	CopyOf       string       `json:"copy_of,omitempty" jsonschema:"the key of the intent this one re-executes under a new key, when an operator made it so (outboxd replay --new-key)"`
	ReplayedAs   *intent.Copy `json:"replayed_as,omitempty" jsonschema:"where the operation went when an operator re-executed it under a new key: that intent's key and status now (gone: no longer kept, deleted after the retention period once delivered or canceled)"`
	MayHaveActed *ops.Reached `json:"may_have_acted,omitempty" jsonschema:"set on a canceled or dead intent an attempt of which may have reached the receiver: the effect may have happened, which canceling or the relay giving up cannot undo"`
}

// operation is the [Operation] of in, by its notes n.
func operation(n intent.Notes, in outbox.Intent) Operation {
	c, acted := n.Of(in.Key)
	return Operation{CopyOf: c.CopyOf, ReplayedAs: c.ReplayedAs, MayHaveActed: acted}
}

// GetOutput is the output of get_intent.
type GetOutput struct {
	Intent Intent `json:"intent"`
	Operation
	Message string `json:"message"`
}

// ListOutput is the output of list_intents.
type ListOutput struct {
	Intents []ListedIntent `json:"intents"`
	// Next is the cursor to pass as after for the next page; empty at the end.
	Next string `json:"next,omitempty"`
	// Message warns, when the page holds dead, held or canceled intents, that this
	// server cannot tell whether an operator re-executed them under a new key, as
	// get_intent warns of one: listed without it, they read as failed operations.
	Message string `json:"message,omitempty"`
}

// ListedIntent is an intent of list_intents, with its copies as get_intent names them:
// listed dead without them, an intent whose operation an operator re-executed under a
// new key reads as failed.
type ListedIntent struct {
	Intent
	Operation
}

// tools holds what the tool handlers share.
type tools struct {
	svc      *intent.Service
	tokenFor TokenFunc
	log      *slog.Logger
	timeout  time.Duration
}

// New returns an MCP server with the tools propose_intent, get_intent and
// list_intents over svc. Each call acts as the token tokenFor returns. Run it with
// [ServeStdio], [Handler], or any transport of the SDK.
func New(svc *intent.Service, tokenFor TokenFunc, cfg *Config) *mcp.Server {
	if svc == nil || tokenFor == nil {
		panic("mcpserver.New: svc and tokenFor are required")
	}
	c := cfg.withDefaults()
	t := &tools{svc: svc, tokenFor: tokenFor, log: c.Logger.With("component", "mcp"), timeout: c.CallTimeout}
	s := mcp.NewServer(&mcp.Implementation{Name: "outboxd", Title: "outboxd intents", Version: c.Version},
		&mcp.ServerOptions{Instructions: instructions})
	addTool(s, t.log, &mcp.Tool{
		Name: ToolPropose, Title: "Propose an intent", Description: proposeDescription,
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	}, withTimeout(t, t.propose))
	addTool(s, t.log, &mcp.Tool{
		Name: ToolGet, Title: "Read an intent", Description: getDescription,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, withTimeout(t, t.get))
	addTool(s, t.log, &mcp.Tool{
		Name: ToolList, Title: "List intents", Description: listDescription,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, withTimeout(t, t.list))
	return s
}

func ptr[T any](v T) *T { return &v }

// addTool adds a tool as [mcp.AddTool] does, with input and output schemas derived from
// In and Out and the input checked against its schema, but sends h's output as
// encoding/json writes it. mcp.AddTool checks an output by decoding it into
// map[string]any and sends what it decoded: a payload's integer past 2^53 lost digits
// (an amount of 12345678901234567891 read 12345678901234567000), and a number past a
// float64's range (1e400, which jsonb takes) or nesting past 1,000 levels failed the
// call, and with it every page of list_intents holding that row.
//
// A panic in h fails the call with an error and is logged to log: the SDK runs handlers
// on goroutines of its own without recovering, so a panic ended the whole process, and
// with it the relay and the intent API that `outboxd serve` runs beside MCP.
func addTool[In, Out any](s *mcp.Server, log *slog.Logger, t *mcp.Tool, h mcp.ToolHandlerFor[In, Out]) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("addTool %s: input schema: %v", t.Name, err))
	}
	inResolved, err := in.Resolve(&jsonschema.ResolveOptions{ValidateDefaults: true})
	if err != nil {
		panic(fmt.Sprintf("addTool %s: input schema: %v", t.Name, err))
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("addTool %s: output schema: %v", t.Name, err))
	}
	tt := *t
	tt.InputSchema, tt.OutputSchema = oneTyped(in), out
	s.AddTool(&tt, func(ctx context.Context, req *mcp.CallToolRequest) (res *mcp.CallToolResult, err error) {
		defer func() {
			if p := recover(); p != nil {
				log.ErrorContext(ctx, "MCP tool call panicked", "tool", t.Name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				res, err = &mcp.CallToolResult{}, nil
				res.SetError(fmt.Errorf("%s failed inside outboxd (a bug, logged there); whether it wrote anything is unknown: get_intent with the same key tells", t.Name))
			}
		}()
		var args In
		if err := decodeArguments(req.Params.Arguments, inResolved, &args); err != nil {
			res := &mcp.CallToolResult{}
			res.SetError(fmt.Errorf("validating \"arguments\": %w", err))
			return res, nil
		}
		res, output, err := h(ctx, req, args)
		if err != nil {
			var wire *jsonrpc.Error
			if errors.As(err, &wire) {
				return nil, wire
			}
			res = &mcp.CallToolResult{}
			res.SetError(err)
			return res, nil
		}
		if res == nil {
			res = &mcp.CallToolResult{}
		}
		b, err := json.Marshal(output)
		if err != nil {
			return nil, fmt.Errorf("marshaling output: %w", err)
		}
		res.StructuredContent = json.RawMessage(b)
		if res.Content == nil {
			res.Content = []mcp.Content{&mcp.TextContent{Text: string(b)}}
		}
		return res, nil
	})
}

// oneTyped returns a copy of an input schema whose properties of a type or null (a
// slice, such as key_parts: "type": ["null", "array"]) have the type alone, for
// tools/list. Gemini's function declarations take one type per property, so clients that
// hand it the tools (gemini-cli, opencode, Copilot CLI) had every request refused, whatever
// the agent asked, once outboxd's tools were listed. Arguments are still checked against
// the schema as derived, so a null is taken as the argument not given.
func oneTyped(s *jsonschema.Schema) *jsonschema.Schema {
	c := s.CloneSchemas()
	for _, p := range c.Properties {
		if i := slices.Index(p.Types, "null"); i >= 0 && len(p.Types) == 2 {
			p.Type, p.Types = p.Types[1-i], nil
		}
	}
	return c
}

// decodeArguments checks a tool call's arguments against the tool's input schema, with
// its defaults applied, and decodes them into v, as mcp.AddTool does. A payload that is a
// JSON object is checked and decoded as {}: propose reads it from the raw arguments
// (rawPayload) and leaves its numbers to the outbox, as the intent API does, where
// map[string]any needed each to fit a float64 and refused 1e400, which jsonb takes.
func decodeArguments(raw json.RawMessage, schema *jsonschema.Resolved, v any) error {
	args := map[string]any{}
	if len(raw) > 0 {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil {
			return err
		}
		for name, value := range fields {
			var arg any
			if name == "payload" && bytes.HasPrefix(bytes.TrimSpace(value), []byte("{")) {
				arg = map[string]any{}
			} else if err := json.Unmarshal(value, &arg); err != nil {
				return err
			}
			args[name] = arg
		}
	}
	if err := schema.ApplyDefaults(&args); err != nil {
		return err
	}
	if err := schema.Validate(&args); err != nil {
		return err
	}
	b, err := json.Marshal(args)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// errCallTimeout is the cause of a tool call's context ending at [Config.CallTimeout].
var errCallTimeout = errors.New("tool call timed out")

// withTimeout bounds each call of h by t.timeout.
func withTimeout[In, Out any](t *tools, h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		ctx, cancel := context.WithTimeoutCause(ctx, t.timeout, errCallTimeout)
		defer cancel()
		return h(ctx, req, in)
	}
}

// token returns the caller's token, or a tool error.
func (t *tools) token(ctx context.Context, req *mcp.CallToolRequest) (*intent.Token, error) {
	tok, err := t.tokenFor(ctx, req)
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, fmt.Errorf("%w: no token for this session", intent.ErrUnauthorized)
	}
	return tok, nil
}

func (t *tools) propose(ctx context.Context, req *mcp.CallToolRequest, in ProposeInput) (*mcp.CallToolResult, ProposeOutput, error) {
	tok, err := t.token(ctx, req)
	if err != nil {
		return nil, ProposeOutput{}, err
	}
	key, err := proposalKey(in)
	if err != nil {
		return nil, ProposeOutput{}, err
	}
	payload, err := rawPayload(req)
	if err != nil {
		return nil, ProposeOutput{}, err
	}
	var notBefore *time.Time
	if in.NotBefore != "" {
		nb, err := time.Parse(time.RFC3339, in.NotBefore)
		if err != nil {
			return nil, ProposeOutput{}, fmt.Errorf("not_before %q is not an RFC 3339 time such as 2030-01-02T15:04:05Z (a date, a time and a zone); nothing was written", in.NotBefore)
		}
		notBefore = &nb
	}
	created, err := t.svc.Propose(ctx, tok, key, intent.CreateRequest{
		Connector: in.Connector, Payload: payload, OrderingKey: in.OrderingKey, NotBefore: notBefore,
	})
	if errors.Is(err, intent.ErrPathlessKey) {
		return nil, ProposeOutput{}, fmt.Errorf("key %q cannot be named in the intent API's URL paths, so the intent could not be read or decided there. "+
			"Pass key_parts naming the decision instead (the server derives a key from them); nothing was written", key)
	}
	var n intent.Notes
	if err == nil && !created.Inserted {
		n, err = t.svc.Notes(ctx, tok, []outbox.Intent{created})
	}
	if problem := unsendableKey(in.Connector, key); errors.Is(err, outbox.ErrInvalidMessage) && problem != "" {
		return nil, ProposeOutput{}, fmt.Errorf("key %q cannot be sent by the %s connector: %s. Pass key_parts naming the decision instead (the server derives a key every connector can send); nothing was written",
			key, outbox.ConnectorKind(in.Connector), problem)
	}
	if err != nil {
		return nil, ProposeOutput{}, t.toolError(ctx, ToolPropose, key, err)
	}
	t.log.InfoContext(ctx, "intent proposed", "key", created.Key, "connector", created.Connector,
		"status", created.Status, "inserted", created.Inserted, "token", tok.Name, "reason", in.Reason)
	out := ProposeOutput{
		Intent:    fromIntent(created),
		Inserted:  created.Inserted,
		Replayed:  !created.Inserted,
		Operation: operation(n, created),
		Reason:    in.Reason,
	}
	verb := "Created"
	if out.Replayed {
		verb = "This decision was already proposed under this key; nothing new was written. Existing"
	}
	out.Message = fmt.Sprintf("%s intent %s, status %s. %s", verb, created.Key, created.Status, step(n, created))
	return nil, out, nil
}

func (t *tools) get(ctx context.Context, req *mcp.CallToolRequest, in GetInput) (*mcp.CallToolResult, GetOutput, error) {
	tok, err := t.token(ctx, req)
	if err != nil {
		return nil, GetOutput{}, err
	}
	got, err := t.svc.Get(ctx, tok, in.Key)
	var n intent.Notes
	if err == nil {
		n, err = t.svc.Notes(ctx, tok, []outbox.Intent{got})
	}
	if err != nil {
		return nil, GetOutput{}, t.toolError(ctx, ToolGet, in.Key, err)
	}
	msg := fmt.Sprintf("Intent %s is %s after %d attempt(s). ", got.Key, got.Status, got.Attempts) + step(n, got)
	return nil, GetOutput{Intent: fromIntent(got), Operation: operation(n, got), Message: msg}, nil
}

// over says in's status, dead, held or canceled, is one an operator may have moved its
// operation on from under a new key.
func over(in outbox.Intent) bool {
	return slices.Contains([]string{outbox.StatusDead, outbox.StatusHeld, outbox.StatusCanceled}, in.Status)
}

// step tells the agent what to do about in, with its notes: where its operation went
// when an operator re-executed it under a new key, that a canceled one may have
// happened, or else nextStep.
func step(n intent.Notes, in outbox.Intent) string {
	c := n.Copies[in.Key]
	msg := ""
	if c.CopyOf != "" {
		msg += fmt.Sprintf("An operator made this intent to re-execute the operation of intent %s under a new key. ", c.CopyOf)
	}
	switch {
	case c.ReplayedAs != nil && over(in):
		// The operation went on under the copy's key, which is what the agent needs to
		// follow; this row's own next step (an operator may replay it) is past.
		return msg + copyStep(c.ReplayedAs)
	case (in.Status == outbox.StatusCanceled || in.Status == outbox.StatusDead) && n.Acted[in.Key].Reason != "":
		// "Canceled and will not happen" is untrue of an operation whose receiver may have
		// performed it before the cancel, and the agent acts on it; so is "the relay gave
		// up", read as failed, of one whose earlier attempt may have reached the receiver.
		return msg + "It was " + n.Acted[in.Key].Reason + ". So it may have happened: do not propose it again, under this key or a new one; " +
			"ask an operator whether the receiver acted."
	case c.Unknown && over(in):
		return msg + nextStep(in) + " But this server's database role may not read the audit trail (SELECT on outbox_audit), " +
			"so it cannot tell whether an operator re-executed this intent under a new key: ask an operator before taking it as failed."
	}
	return msg + nextStep(in)
}

func (t *tools) list(ctx context.Context, req *mcp.CallToolRequest, in ListInput) (*mcp.CallToolResult, ListOutput, error) {
	tok, err := t.token(ctx, req)
	if err != nil {
		return nil, ListOutput{}, err
	}
	f := ops.Filter{Connector: in.Connector, Limit: int(in.Limit), After: in.After}
	for s := range strings.SplitSeq(in.Status, ",") {
		if s = strings.TrimSpace(s); s != "" {
			f.Status = append(f.Status, s)
		}
	}
	page, err := t.svc.List(ctx, tok, f)
	var n intent.Notes
	if err == nil {
		n, err = t.svc.Notes(ctx, tok, page.Intents)
	}
	if err != nil {
		return nil, ListOutput{}, t.toolError(ctx, ToolList, "", err)
	}
	out := ListOutput{Intents: make([]ListedIntent, 0, len(page.Intents)), Next: page.Next}
	for _, in := range page.Intents {
		out.Intents = append(out.Intents, ListedIntent{Intent: fromIntent(in), Operation: operation(n, in)})
		if n.Copies[in.Key].Unknown && over(in) {
			out.Message = "This server's database role may not read the audit trail (SELECT on outbox_audit), so it cannot tell whether " +
				"an operator re-executed a dead, held or canceled intent under a new key: ask an operator before taking one as failed."
		}
	}
	return nil, out, nil
}

// proposalKey returns the key of a proposal: key, or the key derived from key_parts.
func proposalKey(in ProposeInput) (string, error) {
	switch {
	case in.Key != "" && len(in.KeyParts) > 0:
		return "", errors.New("give either key or key_parts, not both: key_parts derive the key, so the same decision always gets the same one")
	case in.Key != "":
		// Checked here, not left to the outbox, whose refusal would end "propose again
		// with the same key": the key itself must change.
		if n := utf8.RuneCountInString(in.Key); n > outbox.MaxKeyLength {
			return "", fmt.Errorf("key is %d characters; the limit is %d. Pass key_parts naming the decision instead (the server derives a shorter key from them); nothing was written", n, outbox.MaxKeyLength)
		}
		if strings.ContainsRune(in.Key, 0) {
			return "", errors.New("key contains a NUL character. Pass key_parts naming the decision instead (the server derives a key from them); nothing was written")
		}
		// A key the connector cannot send is left to the outbox (see unsendableKey): an
		// intent written under it before the rule is still the answer to its request.
		return in.Key, nil
	case len(in.KeyParts) > 0:
		return outbox.Key(in.KeyParts...), nil
	default:
		return "", errors.New("a key is required: pass key_parts naming the decision (such as [run id, step, target]) or a key derived from them; never a time or an attempt number")
	}
}

// unsendableKey says why connector cannot send key, or "". These are the outbox's
// refusals that concern the key alone: checked once the outbox refused the proposal, so
// that the tool error asks for another key, where the outbox's refusal of an invalid
// request ends "propose again with the same key". Not before: the outbox answers the same
// request under such a key, written before the rule (an older outboxd, plain SQL), with
// that intent, whose stored outcome is the answer to the key; refused up front, an agent
// that retried a performed effect was told nothing was written, took a new key, and had
// it performed again.
func unsendableKey(connector, key string) string {
	kind := outbox.ConnectorKind(connector)
	if !outbox.ValidConnectorName(connector) || !slices.Contains(outbox.Kinds, kind) {
		return "" // no connector to send it: the outbox's refusal names the connector
	}
	if kind == "slack" {
		return "" // the key rides in message metadata, not in a header
	}
	if problem := connectors.KeyHeaderProblem(key); problem != "" {
		return problem
	}
	if kind == "payment" {
		// Stripe counts bytes, and the payment connector refuses a key with any Unicode
		// white space at either end.
		if len(key) > outbox.MaxKeyLength {
			return fmt.Sprintf("it is %d bytes, and Stripe accepts at most %d", len(key), outbox.MaxKeyLength)
		}
		if strings.TrimSpace(key) != key {
			return "it begins or ends with white space, which the payment connector refuses"
		}
	}
	return ""
}

// rawPayload returns the payload argument as the client sent it. The SDK hands the
// typed handler arguments that went through map[string]any, where integers past 2^53
// lose digits; reading the raw arguments keeps the request exactly as sent, which the
// key's idempotency check compares.
func rawPayload(req *mcp.CallToolRequest) (json.RawMessage, error) {
	var args struct {
		Payload json.RawMessage `json:"payload"`
	}
	if req != nil && req.Params != nil {
		if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
			return nil, fmt.Errorf("arguments are not a JSON object: %w", err)
		}
	}
	if len(args.Payload) == 0 {
		return nil, errors.New("payload is required: a JSON object with what the connector needs")
	}
	return args.Payload, nil
}

// nextStep tells the agent what to do about an intent in its current status.
func nextStep(in outbox.Intent) string {
	switch in.Status {
	case outbox.StatusAwaitingApproval:
		return "It waits for a person's approval; check later with get_intent and do not propose it again."
	case outbox.StatusPending, outbox.StatusDelivering:
		return "The relay will perform it; follow it with get_intent using the same key, and do not propose it again."
	case outbox.StatusDelivered:
		return "It is done; result holds the receiver's answer."
	case outbox.StatusDead:
		return "The relay gave up (see last_error); an operator may replay it, under this key or a new one, which get_intent on this key then names (replayed_as). " +
			"Do not propose it again under a new key."
	case outbox.StatusHeld:
		return "An operator must decide whether it happened; do not propose it again."
	case outbox.StatusCanceled:
		return "It was canceled or rejected and will not happen."
	default:
		return ""
	}
}

// copyStep tells the agent where the operation of an intent went that an operator
// re-executed under a new key, the copy cp, and what to do next.
func copyStep(cp *intent.Copy) string {
	if cp.Gone {
		return fmt.Sprintf("An operator re-executed its operation under the new key %s, which the outbox no longer keeps "+
			"(delivered and canceled intents are deleted after its retention period), so it may have happened; "+
			"do not propose it again.", cp.Key)
	}
	return fmt.Sprintf("An operator re-executed its operation under the new key %s, which is %s: that intent is where the operation went; "+
		"read it with get_intent (key %s) instead of this one, and do not propose it again.", cp.Key, cp.Status, cp.Key)
}

// toolError turns a service error into the text of a tool error: what went wrong and
// what to do next. Errors the agent cannot act on are logged and hidden.
func (t *tools) toolError(ctx context.Context, tool, key string, err error) error {
	switch {
	case errors.Is(err, intent.ErrUnauthorized):
		return err
	case errors.Is(err, intent.ErrForbidden):
		return fmt.Errorf("%w; use a connector this token allows, or ask an operator to allow it", err)
	case errors.Is(err, outbox.ErrKeyConflict):
		// Only the sentinel's words: the full error names the existing row's connector
		// and age, which may be a row this token may not see.
		return fmt.Errorf("key %q already names a different decision (%w). If this is the same decision, send exactly the same connector, payload and ordering_key; "+
			"if it is a new decision, derive a new key from it. Read the existing intent with get_intent", key, outbox.ErrKeyConflict)
	case errors.Is(err, outbox.ErrInvalidMessage):
		return fmt.Errorf("%w; nothing was written, fix it and propose again with the same key", err)
	case errors.Is(err, outbox.ErrNotFound):
		// Not "never proposed": retention deletes finished intents, and an agent that
		// takes the bare error so proposes it again has the receiver act again.
		return fmt.Errorf("%w (or it belongs to a connector this token may not use). Not found does not mean never proposed: "+
			"delivered and canceled intents are deleted after the outbox's retention period (OUTBOX_RETENTION, 7 days by default), "+
			"so one proposed before may have been performed, and proposing it again under this key would act again", err)
	case errors.Is(err, ops.ErrInvalidFilter):
		return err
	case errors.Is(context.Cause(ctx), errCallTimeout):
		t.log.ErrorContext(ctx, "tool timed out", "tool", tool, "key", key, "timeout", t.timeout.String(), "err", err)
		if key != "" {
			return fmt.Errorf("%s: the database did not answer within %s; calling again later with the same key %q is safe", tool, t.timeout, key)
		}
		return fmt.Errorf("%s: the database did not answer within %s; try again later", tool, t.timeout)
	case ctx.Err() == nil && intent.Unavailable(err):
		// The database is down or unreachable, or ended the session the call had (a
		// restart, a failover): worth saying, so the agent waits instead of treating it as
		// a fault of its request. The details (host, user) stay in the log. Not "nothing
		// was written": a session that ended as its COMMIT went out may have committed
		// it, and a call with the key finds out.
		// Before the context errors: a connect_timeout of the pool's own (outboxd mcp
		// gives each connection 10s) ends the connect with context.DeadlineExceeded while
		// the call's context is still alive.
		t.log.ErrorContext(ctx, "tool failed: database unavailable", "tool", tool, "key", key, "err", err)
		if tool == ToolPropose && !intent.NothingWritten(err) {
			// The session ended or was lost mid-call: the proposal may have committed and
			// lost only its answer. Told nothing was written, the agent may take the
			// effect for one that will not happen.
			return fmt.Errorf("%s: the database is unavailable and the call ended before its answer, so the intent may or may not have been written; "+
				"calling again later with the same key %q is safe and tells which", tool, key)
		}
		if key != "" {
			return fmt.Errorf("%s: the database is unavailable; calling again later with the same key %q is safe", tool, key)
		}
		return fmt.Errorf("%s: the database is unavailable; try again later", tool)
	case ctx.Err() == nil && intent.Contended(err):
		// PostgreSQL ended the call's transaction on a conflict with concurrent work, as
		// the intent API answers 503 for: the same call again may well succeed. Reported
		// as an internal error, it read as a fault of outboxd's, which an agent may not
		// retry, or may take as the effect failed and act another way.
		t.log.WarnContext(ctx, "tool failed: the database ended the call's transaction on a conflict with concurrent work",
			"tool", tool, "key", key, "err", err)
		const why = "the database ended the call's transaction on a conflict with concurrent work (a serialization failure or a deadlock)"
		if key != "" {
			return fmt.Errorf("%s: %s; calling again with the same key %q is safe", tool, why, key)
		}
		return fmt.Errorf("%s: %s; try again", tool, why)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", tool, err)
	default:
		t.log.ErrorContext(ctx, "tool failed", "tool", tool, "key", key, "err", err)
		if key != "" {
			return fmt.Errorf("%s: internal error; calling again with the same key %q is safe", tool, key)
		}
		return fmt.Errorf("%s: internal error; try again", tool)
	}
}
