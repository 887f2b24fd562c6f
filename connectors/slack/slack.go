package slack

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
	"strconv"
	"strings"
	"sync"
	"time"

	slackgo "github.com/slack-go/slack"

	"github.com/outboxd/outboxd/connectors"
)

// Config configures a [Connector]. A zero field means its default.
type Config struct {
	// Token is the bot token ("xoxb-…") the messages are posted with. It needs the
	// chat:write scope, and channels:history, groups:history, im:history or mpim:history
	// for the kinds of conversation it posts to, so that it can reconcile; and its bot
	// must be a member of each (chat:write.public posts without, but does not read
	// history). Required.
	Token string
	// APIBase is the Web API root, with or without a trailing slash. Defaults to
	// "https://slack.com/api/".
	APIBase string
	// HTTPClient sends the requests; it is copied, and the copy never follows redirects.
	// Defaults to a client on a keep-alive transport shared by every connector built
	// without one.
	HTTPClient *http.Client
	// Timeout bounds one attempt: the history lookup (when there is one) and the post.
	// Defaults to 30s.
	Timeout time.Duration
	// HistoryLimit is how many messages each page of a retry's lookup for an earlier
	// attempt's message asks for (of the conversation's history, newest first, or of a
	// thread's replies), at most 999; the lookup reads up to 10 pages. Defaults to 100.
	HistoryLimit int
}

// String describes cfg without its token, so fmt never prints it.
func (cfg Config) String() string {
	return fmt.Sprintf("slack.Config{Token:%s APIBase:%s Timeout:%s HistoryLimit:%d}",
		redactToken(cfg.Token), connectors.RedactURL(cfg.APIBase), cfg.Timeout, cfg.HistoryLimit)
}

// GoString keeps the token out of %#v too.
func (cfg Config) GoString() string { return cfg.String() }

// LogValue keeps the token out of logs.
func (cfg Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("token", redactToken(cfg.Token)),
		slog.String("api_base", connectors.RedactURL(cfg.APIBase)),
		slog.Duration("timeout", cfg.Timeout),
		slog.Int("history_limit", cfg.HistoryLimit),
	)
}

const (
	// DefaultAPIBase is the Slack Web API root.
	DefaultAPIBase = "https://slack.com/api/"
	// EventType is the message metadata event_type under which the key is posted.
	EventType = "outboxd_intent"
	// KeyField is the field of the metadata's event_payload that holds the key.
	KeyField = "idempotency_key"

	defaultTimeout      = 30 * time.Second
	defaultHistoryLimit = 100
	maxHistoryLimit     = 999 // what conversations.history and conversations.replies accept
	// maxLookupPages bounds how many pages of history (newest first) or of a thread's
	// replies (oldest first) a retry reads.
	maxLookupPages = 10
	// lookupClockSkew is how much earlier than the row's first attempt (the relay's
	// clock) the lookup starts reading (Slack's clock stamps the messages).
	lookupClockSkew = 10 * time.Minute
	// maxBlocks is how many Block Kit blocks Slack takes in one message.
	maxBlocks = 50
)

// ErrTimeout is the cause of an attempt that ran past [Config.Timeout]; errors.Is finds
// it in the error Deliver returns.
var ErrTimeout = errors.New("slack attempt timed out")

// Connector posts rows to Slack with chat.postMessage. It is safe for concurrent use.
type Connector struct {
	api          *slackgo.Client
	base         string // the API root, ending in a slash
	timeout      time.Duration
	historyLimit int
}

var _ connectors.Connector = (*Connector)(nil)

var sharedTransport = sync.OnceValue(func() *http.Transport {
	t := connectors.CloneDefaultTransport()
	// Many rows go to one host: keep enough idle connections that a burst reuses them.
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	t.IdleConnTimeout = 90 * time.Second
	return t
})

// New returns a connector for cfg, or an error naming each field that is wrong. The
// errors never quote the token.
func New(cfg Config) (*Connector, error) {
	cfg = cfg.withDefaults()
	var errs []error
	if cfg.Token == "" {
		errs = append(errs, errors.New("Token: required"))
	} else if strings.TrimSpace(cfg.Token) != cfg.Token || strings.ContainsAny(cfg.Token, " \t\r\n") {
		errs = append(errs, errors.New("Token: contains whitespace"))
	}
	base, err := parseBase(cfg.APIBase)
	if err != nil {
		errs = append(errs, err)
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout: %s is negative", cfg.Timeout))
	}
	if cfg.HistoryLimit < 0 || cfg.HistoryLimit > maxHistoryLimit {
		errs = append(errs, fmt.Errorf("HistoryLimit: %d is not between 1 and %d", cfg.HistoryLimit, maxHistoryLimit))
	}
	for i, err := range errs {
		errs[i] = fmt.Errorf("slack config: %w", err) // one line per problem, each complete
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	client := &http.Client{Transport: sharedTransport()}
	if cfg.HTTPClient != nil {
		copied := *cfg.HTTPClient
		client = &copied
	}
	// A redirected POST would be resent as a GET without its body; a 3xx is an answer to
	// classify, not a place to go.
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	client.Transport = slackAnswers{
		next:        retryAfterSeconds{cmp.Or[http.RoundTripper](client.Transport, http.DefaultTransport)},
		lookupLimit: max(maxPostAnswerBytes, int64(cfg.HistoryLimit)*lookupAnswerBytesPerMessage),
	}

	return &Connector{
		// No slackgo.OptionRetry: the relay owns retries, and a library retry of a post
		// would be a second message the relay never sees.
		api:          slackgo.New(cfg.Token, slackgo.OptionAPIURL(base), slackgo.OptionHTTPClient(client)),
		base:         base,
		timeout:      cfg.Timeout,
		historyLimit: cfg.HistoryLimit,
	}, nil
}

// retryAfterSeconds rewrites a 429's Retry-After as the delta-seconds slack-go reads, for
// it takes nothing else: an HTTP date would make the refusal an error without a status,
// classified as a post that got no answer. One that is neither is dropped, so that the
// 429 is retried with backoff.
type retryAfterSeconds struct{ next http.RoundTripper }

func (t retryAfterSeconds) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if a, ok := req.Context().Value(lastAnswerKey{}).(*lastAnswer); ok {
		a.keep(resp)
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		return resp, nil
	}
	if d, ok := connectors.RetryAfterOf(resp.Header, time.Now()); ok {
		resp.Header.Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
	} else {
		resp.Header.Del("Retry-After")
	}
	return resp, nil
}

// CloseIdleConnections closes the idle connections of the transport underneath.
func (t retryAfterSeconds) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// lastAnswerKey is the context key of an attempt's *lastAnswer.
type lastAnswerKey struct{}

// lastAnswer is the status and headers of an attempt's latest answer. slack-go's
// StatusCodeError keeps the status alone, and it reads Retry-After only on a 429: a
// Retry-After with another status to retry (a 503 of Slack's, or of a proxy in front
// of it) wins over the relay's backoff too (DESIGN.md), as the other connectors read
// it, and is found here.
type lastAnswer struct {
	mu     sync.Mutex
	status int
	header http.Header
}

func (a *lastAnswer) keep(resp *http.Response) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.status, a.header = resp.StatusCode, resp.Header
}

// retryAfter returns err marked with the delay the Retry-After of the attempt's latest
// answer asks for (see [connectors.RetryAfterOf]), when that answer had status code.
func retryAfter(ctx context.Context, code int, err error) error {
	a, ok := ctx.Value(lastAnswerKey{}).(*lastAnswer)
	if !ok {
		return err
	}
	a.mu.Lock()
	status, header := a.status, a.header
	a.mu.Unlock()
	if status != code {
		return err
	}
	if d, ok := connectors.RetryAfterOf(header, time.Now()); ok {
		return connectors.RetryAfter(err, d)
	}
	return err
}

// slackAnswers refuses an HTTP 200 whose body is not an answer of Slack's Web API, which
// always says "ok": true, or false with an error code. slack-go takes a body with
// neither for a success (it reads a missing error code as none): a post so answered
// would be stored as delivered, without a ts, though nothing may have been posted, and a
// lookup so answered read as a conversation without the key, after which the retry
// would post again.
//
// It reads no more of an answer than its bound (see [maxPostAnswerBytes]): slack-go
// decodes every answer with no bound of its own, and an answer without end (a proxy
// streaming a file) held all an attempt could read within its time limit, at up to the
// relay's concurrency at once.
type slackAnswers struct {
	next        http.RoundTripper
	lookupLimit int64 // the bound of a lookup's answer, which holds up to HistoryLimit messages
}

const (
	// maxPostAnswerBytes bounds chat.postMessage's answer, which echoes one message (at
	// most 40,000 characters of text and 50 blocks): far smaller.
	maxPostAnswerBytes = 1 << 20
	// lookupAnswerBytesPerMessage is what a lookup's answer may hold for each message a
	// page asks for (Config.HistoryLimit), at least maxPostAnswerBytes in all.
	lookupAnswerBytesPerMessage = 64 << 10
)

func (t slackAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.GetBody != nil {
		// slack-go gives every request GetBody, with which net/http's HTTP/2 transport
		// resends a request by itself after a stream reset (REFUSED_STREAM, or
		// PROTOCOL_ERROR: golang/go#47635) or a GOAWAY, though Slack (or a proxy before
		// it) may have taken the whole post already: a second message the relay never
		// sees. Without it the attempt ends, and the relay decides.
		req = req.Clone(req.Context())
		req.GetBody = nil
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	limit := t.lookupLimit
	if strings.HasSuffix(req.URL.Path, "/chat.postMessage") {
		limit = maxPostAnswerBytes
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	_ = resp.Body.Close()
	if err != nil {
		return nil, err // the connection failed mid-answer
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("%w (%d KiB, read no further)", errAnswerTooLarge, limit>>10)
	}
	var answer struct {
		OK    *bool  `json:"ok"`
		Error string `json:"error"`
	}
	// Decoded as slack-go does (the first JSON value), so that both read the same answer.
	if json.NewDecoder(bytes.NewReader(body)).Decode(&answer) != nil || answer.OK == nil || (!*answer.OK && answer.Error == "") {
		return nil, errNotSlackAnswer
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// CloseIdleConnections closes the idle connections of the transport underneath.
func (t slackAnswers) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// errNotSlackAnswer is an HTTP 200 that slackAnswers refused. It does not quote the body:
// a service that echoes requests would show the token.
var errNotSlackAnswer = errors.New(`HTTP 200 without Slack's "ok" and error code: not an answer of the Slack Web API (is APIBase right?)`)

// errNoCursor is a lookup's page that says there are more messages and gives no cursor
// to ask for them.
var errNoCursor = errors.New(`answered has_more without a next_cursor: the messages after this page cannot be asked for (is APIBase right?)`)

// errAnswerTooLarge is an HTTP 200 longer than slackAnswers reads.
var errAnswerTooLarge = errors.New(`HTTP 200 longer than an answer of the Slack Web API (is APIBase right? for a lookup, a smaller HistoryLimit asks for shorter pages)`)

// errNoMessages is a lookup's "ok" without the messages, which Slack always gives.
var errNoMessages = errors.New(`answered "ok" without "messages": not an answer of the Slack Web API (is APIBase right?)`)

func (cfg Config) withDefaults() Config {
	cfg.APIBase = cmp.Or(cfg.APIBase, DefaultAPIBase)
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.HistoryLimit = cmp.Or(cfg.HistoryLimit, defaultHistoryLimit)
	return cfg
}

// parseBase checks the API root and returns it with exactly one trailing slash, which
// slack-go expects (it appends method names such as "chat.postMessage").
func parseBase(raw string) (string, error) {
	u, err := connectors.ParseAPIBase("APIBase", raw) // which refuses credentials: the token authenticates
	if err != nil {
		return "", err
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/"
	u.RawPath = ""
	return u.String(), nil
}

// redactToken shows only a token's type prefix ("xoxb-REDACTED"), or nothing.
func redactToken(tok string) string {
	if tok == "" {
		return ""
	}
	if i := strings.IndexByte(tok, '-'); i > 0 && i <= 5 {
		return tok[:i+1] + "REDACTED"
	}
	return "REDACTED"
}

// String names the connector by its API root; it never shows the token.
func (c *Connector) String() string { return "slack " + c.base }

// GoString is String: %#v would print the fields, the secrets among them.
func (c *Connector) GoString() string { return c.String() }

// LogValue keeps the token out of logs.
func (c *Connector) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("api_base", c.base),
		slog.String("token", "REDACTED"),
		slog.Duration("timeout", c.timeout),
		slog.Int("history_limit", c.historyLimit),
		slog.String("guarantee", string(connectors.Reconciled)),
	)
}

// Guarantee reports [connectors.Reconciled]: Slack does not dedupe posts, but a retry
// finds an earlier attempt's message by the key in its metadata before posting again.
func (c *Connector) Guarantee() connectors.Guarantee { return connectors.Reconciled }

// Timeout is the time limit of one attempt (see [connectors.Timeouter]).
func (c *Connector) Timeout() time.Duration { return c.timeout }

// Payload is what a slack row's payload holds.
type Payload struct {
	// Channel is the conversation ID ("C…", "G…" or "D…"). Names and user IDs are
	// refused: the history lookup that reconciles a retry needs the conversation's ID.
	Channel string `json:"channel"`
	// Text is the message text, or its fallback when Blocks is set.
	Text string `json:"text,omitempty"`
	// Blocks is a JSON array of Block Kit blocks. Each must decode with slack-go's
	// types, and is sent as written here.
	Blocks json.RawMessage `json:"blocks,omitempty"`
	// ThreadTS, when set, makes the message a reply in that thread. It must be written
	// as Slack writes a message's ts ("1700000000.000100").
	ThreadTS string `json:"thread_ts,omitempty"`
}

// message is a payload checked and decoded.
type message struct {
	Payload
	blocks slackgo.Blocks // each block as written in the payload (see [verbatimBlock])
}

// verbatimBlock is a block that slack-go decoded, for the check, but that encodes as the
// payload wrote it. slack-go's types hold only the fields they model: encoded from
// them, a block would reach Slack without any field newer than the library (a section's
// field Block Kit added last month, a button's new property), silently.
type verbatimBlock struct {
	slackgo.Block
	raw json.RawMessage
}

// MarshalJSON returns the block's JSON from the payload.
func (b verbatimBlock) MarshalJSON() ([]byte, error) { return b.raw, nil }

func init() {
	connectors.RegisterPayloadCheck("slack", func(raw []byte) error {
		if err := ValidatePayload(raw); err != nil {
			// outbox.Enqueue names the payload itself ("slack payload: ...").
			return errors.New(strings.TrimPrefix(err.Error(), "payload: "))
		}
		return nil
	})
}

// ValidatePayload reports whether raw is a payload this connector can post, and if not,
// why. Deliver refuses such a payload as permanent. It is registered for the slack kind
// (see [connectors.RegisterPayloadCheck]): outbox.Enqueue runs it in programs that import
// this package, such as outboxd, so that blocks Block Kit does not take are refused
// before the row is written.
func ValidatePayload(raw json.RawMessage) error {
	_, err := parsePayload(raw)
	return err
}

func parsePayload(raw json.RawMessage) (message, error) {
	var m message
	if err := connectors.DecodeObject(raw, &m.Payload); err != nil {
		return m, err
	}
	if m.Channel == "" {
		return m, errors.New(`payload: "channel" is required`)
	}
	if !connectors.IsSlackConversationID(m.Channel) {
		return m, fmt.Errorf(`payload: "channel" %q is not a conversation ID (C…, G… or D…); names cannot be reconciled`, m.Channel)
	}
	if m.ThreadTS != "" && !connectors.IsSlackMessageTS(m.ThreadTS) {
		// Slack answers "ok" to a thread_ts written otherwise (a float's digits, trailing
		// zeros dropped), and the reply is seen in no thread and not in the channel: the
		// row would be delivered with nobody able to see the message.
		return m, fmt.Errorf(`payload: "thread_ts" %q is not a message ts as Slack writes them (ten digits, a dot, six digits, such as "1700000000.000100"); Slack posts a reply to any other where no one sees it`, m.ThreadTS)
	}
	if b := bytes.TrimSpace(m.Blocks); len(b) > 0 && !bytes.Equal(b, []byte("null")) {
		if b[0] != '[' {
			return m, errors.New(`payload: "blocks" must be a JSON array of Block Kit blocks`)
		}
		if err := m.blocks.UnmarshalJSON(b); err != nil {
			return m, fmt.Errorf(`payload: "blocks": %w`, err)
		}
		var raws []json.RawMessage
		_ = json.Unmarshal(b, &raws) // an array of valid JSON: slack-go just read it the same way
		if len(raws) > maxBlocks {
			// Slack answers invalid_blocks to every attempt: refused before the row is written.
			return m, fmt.Errorf(`payload: "blocks": %d blocks; Slack takes at most %d a message`, len(raws), maxBlocks)
		}
		if len(raws) != len(m.blocks.BlockSet) {
			// slack-go keeps one block per element; were it to skip one, the pairs below would be wrong.
			return m, fmt.Errorf(`payload: "blocks": slack-go decoded %d of the %d blocks`, len(m.blocks.BlockSet), len(raws))
		}
		for i, blk := range m.blocks.BlockSet {
			m.blocks.BlockSet[i] = verbatimBlock{Block: blk, raw: raws[i]}
		}
	}
	if m.Text == "" && len(m.blocks.BlockSet) == 0 {
		return m, errors.New(`payload: "text" or a non-empty "blocks" is required`)
	}
	return m, nil
}

// result is what Deliver returns for the relay to store.
type result struct {
	Channel    string `json:"channel"`
	TS         string `json:"ts"`
	Reconciled bool   `json:"reconciled,omitempty"`
}

// Deliver posts one row. On an attempt after the first, or after an ambiguous one, it
// first looks for a message carrying d.Key in its metadata and returns that instead of
// posting again. See the package documentation for how failures are classified.
func (c *Connector) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	if d.Key == "" {
		return nil, connectors.Permanent(errors.New("deliver slack: the row has no idempotency key"))
	}
	m, err := parsePayload(d.Payload)
	if err != nil {
		return nil, connectors.Permanent(fmt.Errorf("deliver slack: %w", err))
	}

	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, ErrTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, lastAnswerKey{}, new(lastAnswer))

	if d.Attempt > 1 || d.PreviousAmbiguous {
		ts, found, err := c.find(ctx, m, d.Key, d.FirstAttemptAt)
		if err != nil {
			return nil, err
		}
		if found {
			return connectors.MarshalResult(result{Channel: m.Channel, TS: ts, Reconciled: true}), nil
		}
	}

	opts := []slackgo.MsgOption{
		slackgo.MsgOptionMetadata(slackgo.SlackMetadata{
			EventType:    EventType,
			EventPayload: map[string]any{KeyField: d.Key},
		}),
	}
	if m.Text != "" {
		opts = append(opts, slackgo.MsgOptionText(m.Text, false))
	}
	if len(m.blocks.BlockSet) > 0 {
		opts = append(opts, slackgo.MsgOptionBlocks(m.blocks.BlockSet...))
	}
	if m.ThreadTS != "" {
		opts = append(opts, slackgo.MsgOptionTS(m.ThreadTS))
	}

	postCtx, sent := connectors.TraceSend(ctx)
	channel, ts, err := c.api.PostMessageContext(postCtx, m.Channel, opts...)
	if err != nil {
		return nil, c.classify(ctx, "chat.postMessage "+m.Channel, err, sent(err))
	}
	if ts == "" {
		// Slack's "ok" always comes with the message's ts: this answer is no account of a
		// post, which may or may not have been made.
		return nil, connectors.Ambiguous(fmt.Errorf(`chat.postMessage %s: answered "ok" without the message's ts: not an answer of the Slack Web API (is APIBase right?); what answered may have passed the post on to Slack`, m.Channel))
	}
	return connectors.MarshalResult(result{Channel: cmp.Or(channel, m.Channel), TS: ts}), nil
}

// find looks for the message an earlier attempt posted under key: in the conversation's
// history, or for a thread reply, in the thread's replies (in the history when the
// thread is gone), HistoryLimit per page, at most maxLookupPages pages, only those since
// a little before the row's first attempt when that is known. It posts nothing. When
// the pages run out before the messages since then do, it cannot tell whether an earlier
// attempt posted, and says so with an error that is ambiguous and permanent: posting
// again could be a second message. Its errors are classified.
func (c *Connector) find(ctx context.Context, m message, key string, since time.Time) (string, bool, error) {
	oldest := ""
	if !since.IsZero() {
		t := since.Add(-lookupClockSkew)
		oldest = fmt.Sprintf("%d.%06d", t.Unix(), t.Nanosecond()/1000)
	}
	history := func(cursor string) ([]slackgo.Message, bool, string, error) {
		resp, err := c.api.GetConversationHistoryContext(ctx, &slackgo.GetConversationHistoryParameters{
			ChannelID:          m.Channel,
			Cursor:             cursor,
			Limit:              c.historyLimit,
			Oldest:             oldest,
			IncludeAllMetadata: true,
		})
		if err != nil {
			return nil, false, "", err
		}
		return resp.Messages, resp.HasMore, resp.ResponseMetaData.NextCursor, nil
	}
	if m.ThreadTS == "" {
		where := "conversations.history " + m.Channel
		return c.scan(ctx, &where, history, key, since)
	}

	thread := m.ThreadTS
	where := "conversations.replies " + m.Channel + " " + thread
	replies := func(cursor string) ([]slackgo.Message, bool, string, error) {
		return c.api.GetConversationRepliesContext(ctx, &slackgo.GetConversationRepliesParameters{
			ChannelID:          m.Channel,
			Timestamp:          thread,
			Cursor:             cursor,
			Limit:              c.historyLimit,
			Oldest:             oldest,
			IncludeAllMetadata: true,
		})
	}
	page := func(cursor string) ([]slackgo.Message, bool, string, error) {
		msgs, more, next, err := replies(cursor)
		if err != nil || cursor != "" || thread != m.ThreadTS || len(msgs) == 0 || msgs[0].Timestamp != thread {
			return msgs, more, next, err
		}
		if root := msgs[0].ThreadTimestamp; root != "" && root != thread {
			// thread_ts names a reply, not its thread's parent: Slack posted in the
			// parent's thread, but answers for the reply's ts with that reply alone,
			// and read as the whole thread it would hide the message and post it again.
			thread = root
			where = fmt.Sprintf("conversations.replies %s %s (the thread of %s)", m.Channel, thread, m.ThreadTS)
			return replies("")
		}
		return msgs, more, next, err
	}
	ts, found, err := c.scan(ctx, &where, page, key, since)
	if se, ok := errors.AsType[slackgo.SlackErrorResponse](err); !ok || se.Err != "thread_not_found" {
		return ts, found, err
	}
	// The message thread_ts names is gone, and Slack posts a reply to it as a message of
	// the channel's own without a word (see slackgo.PostMessageWithResponseContext): an
	// earlier attempt's reply would be in the channel's history. Not there, the thread's
	// absence stays the answer (permanent), and nothing is posted.
	where = "conversations.history " + m.Channel + " (the thread is gone)"
	hts, hfound, herr := c.scan(ctx, &where, history, key, since)
	switch {
	case herr == nil && hfound:
		return hts, true, nil
	case herr != nil && (!connectors.IsPermanent(herr) || connectors.IsAmbiguous(herr)):
		return "", false, herr // retried, or the history too long to tell
	}
	return "", false, err
}

// scan reads the pages of a conversation (history) or a thread (replies) from page, at
// most maxLookupPages, for a message whose metadata carries key. See [Connector.find].
// Its errors name *where as it is when they happen: page may learn a better name.
func (c *Connector) scan(ctx context.Context, where *string, page func(cursor string) ([]slackgo.Message, bool, string, error), key string, since time.Time) (string, bool, error) {
	cursor, read := "", 0
	for range maxLookupPages {
		msgs, more, next, err := page(cursor)
		if err == nil && msgs == nil {
			// Slack's "ok" always comes with the messages, an empty list when there are
			// none: this answer says nothing of what the conversation holds, and read as
			// a conversation without the key, the retry would post again.
			err = errNoMessages
		}
		if err != nil {
			return "", false, c.classify(ctx, "look up the key in "+*where, err, false)
		}
		read += len(msgs) // Slack may return fewer than the limit asks
		if ts, ok := findKey(msgs, key); ok {
			return ts, true, nil
		}
		if !more {
			return "", false, nil // read to the end: no earlier attempt posted
		}
		if next == "" {
			// More to read, and no way to ask for it: not read to the end, so an earlier
			// attempt's message may be there still. Looked at again on the next attempt.
			return "", false, c.classify(ctx, "look up the key in "+*where, errNoCursor, false)
		}
		cursor = next
	}
	more := "there are more since the row's first attempt"
	if since.IsZero() {
		more = "there are more, and the row's first attempt is unknown (connectors.Delivery.FirstAttemptAt is zero), so the lookup cannot stop before the conversation's beginning"
	}
	return "", false, connectors.Ambiguous(connectors.Permanent(fmt.Errorf(
		"look up the key in %s: not in the %d messages read (%d pages, %d asked for each), and %s; "+
			"an earlier attempt may have posted, so the message is not posted again: check the conversation, then cancel the row or replay it with a new key",
		*where, read, maxLookupPages, c.historyLimit, more)))
}

func findKey(msgs []slackgo.Message, key string) (string, bool) {
	for _, msg := range msgs {
		if msg.Metadata.EventType != EventType {
			continue
		}
		if k, ok := msg.Metadata.EventPayload[KeyField].(string); ok && k == key {
			return msg.Timestamp, true
		}
	}
	return "", false
}

// Slack error codes that a later attempt may not meet. The rest name a problem with the
// request, the token or the conversation, which retrying the same row does not fix.
var (
	// retryableCodes: Slack did not act.
	retryableCodes = map[string]bool{
		"service_unavailable": true,
		"request_timeout":     true,
		"ratelimited":         true,
		"rate_limited":        true,
		// The workspace is migrating into an Enterprise organization, during which Slack
		// says its API is unavailable (now and then, or until the migration completes).
		"team_added_to_org":  true,
		"org_login_required": true,
		// A free workspace's limit on how many messages its members send in a short
		// period: it lifts again, and Slack sends it as a 429 without Retry-After too
		// (slack-go#1383), which is retried with backoff like any 429.
		"message_limit_exceeded": true,
		// A lookup's cursor, handed out by the page before, that Slack no longer takes:
		// the next attempt reads from the first page again.
		"invalid_cursor": true,
	}
	// ambiguousCodes: Slack says some of the operation may have happened.
	ambiguousCodes = map[string]bool{
		"internal_error": true,
		"fatal_error":    true,
	}
)

// classify turns a failed call of op ("chat.postMessage C…") into a classified error.
// wrote says whether a post's request was written in full, after which Slack may have
// acted on it.
func (c *Connector) classify(ctx context.Context, op string, err error, wrote bool) error {
	// *url.Error repeats the method and the endpoint, which op already names.
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	if rl, ok := errors.AsType[*slackgo.RateLimitedError](err); ok {
		return connectors.RetryAfter(fmt.Errorf("%s: %w", op, err), rl.RetryAfter)
	}
	if se, ok := errors.AsType[slackgo.SlackErrorResponse](err); ok {
		err = fmt.Errorf("%s: %w%s", op, err, scopes(se))
		switch {
		case ambiguousCodes[se.Err] && wrote:
			return connectors.Ambiguous(err)
		case ambiguousCodes[se.Err], retryableCodes[se.Err]:
			return err
		default:
			return connectors.Permanent(err)
		}
	}
	if sc, ok := errors.AsType[slackgo.StatusCodeError](err); ok {
		err = fmt.Errorf("%s: %w", op, err)
		if !connectors.RetryableStatus(sc.Code) {
			return connectors.Permanent(err)
		}
		err = retryAfter(ctx, sc.Code, err)
		if wrote && (sc.Code == http.StatusBadGateway || sc.Code == http.StatusGatewayTimeout) {
			// A gateway answered for Slack: it passed the post on and then lost Slack's
			// connection (502) or stopped waiting for its answer (504). Slack may have
			// posted, as after a connection reset of its own.
			return connectors.Ambiguous(fmt.Errorf("%w (a gateway's answer: Slack may have posted the message)", err))
		}
		return err
	}
	if errors.Is(err, errNotSlackAnswer) || errors.Is(err, errAnswerTooLarge) {
		if wrote {
			// Something answered for Slack, as a gateway's 502 does: it may have passed
			// the post on.
			return connectors.Ambiguous(fmt.Errorf("%s: %w; what answered may have passed the post on to Slack", op, err))
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if errors.Is(context.Cause(ctx), ErrTimeout) && !errors.Is(err, ErrTimeout) {
		err = fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	if wrote {
		return connectors.Ambiguous(fmt.Errorf("%s: no answer after the request was sent; Slack may have posted the message: %w", op, err))
	}
	return fmt.Errorf("%s: %w", op, err)
}

// scopes quotes Slack's scope diagnostics from a missing_scope answer.
func scopes(se slackgo.SlackErrorResponse) string {
	if se.Needed == "" && se.Provided == "" {
		return ""
	}
	return fmt.Sprintf(" (needed %q, provided %q)", se.Needed, se.Provided)
}
