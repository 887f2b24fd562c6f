package slacktest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Token is the token the fake takes; any other gets invalid_auth.
const Token = "xoxb-1234-5678-secretpart"

// The fake's idea of the metadata that carries a key: a message whose metadata has
// event_type EventType carries the key in its event_payload's KeyField. The connector's
// exported constants are checked against these in its tests.
const (
	EventType = "outboxd_intent"
	KeyField  = "idempotency_key"
)

// Options configure a [Server]. The zero value is a fake that answers every request as
// its plans, if any, say.
type Options struct {
	// OnPostFunc, when set, is called with the key of each message chat.postMessage
	// stores ("" for one whose metadata carries none), on the request's goroutine, after
	// the message is stored and before the answer, so a test can block here to hold the
	// answer back. It is not called for a post answered without storing a message (a
	// plan's error, a refused channel). Defaults to nil.
	OnPostFunc func(key string)
}

// Server is a running fake Slack Web API; see the package documentation. Its methods
// are safe for concurrent use.
type Server struct {
	t    testing.TB
	srv  *httptest.Server
	opts Options

	mu       sync.Mutex
	lastTS   time.Time             // the latest message's time: ts are the wall clock, unique
	channels map[string][]*Message // oldest first
	plans    map[string][]Plan     // by idempotency key, consumed in order
	posts    map[string]int        // chat.postMessage requests by key
	lookups  map[string]int        // history and replies requests by channel
	historyF []Plan                // plans for the next history/replies requests
	forms    []map[string][]string // every chat.postMessage request's parameters
	maxLimit int                   // the most messages a history or replies page holds, if set
}

// Message is a stored message, as history shows it with its metadata.
type Message struct {
	TS       string         `json:"ts"`
	ThreadTS string         `json:"thread_ts,omitempty"`
	Text     string         `json:"text,omitempty"`
	Blocks   any            `json:"blocks,omitempty"`
	Metadata map[string]any `json:"metadata,omitempty"`
	key      string
}

// Plan scripts the answer to one request. The zero value answers as Slack would.
type Plan struct {
	// Status answers with this HTTP status and no Slack body.
	Status int
	// RetryAfter goes with Status 429.
	RetryAfter string
	// Error answers {"ok":false,"error":Error} with 200.
	Error string
	// Body answers 200 with this body as JSON, as a service that is not Slack's Web API
	// (a proxy's, a wrong APIBase) may.
	Body string
	// DropAfterEffect stores the message, then closes the connection without answering.
	DropAfterEffect bool
	// HangAfterEffect stores the message, then answers nothing until the client gives up.
	HangAfterEffect bool
	// StatusAfterEffect stores the message, then answers with this HTTP status and no
	// Slack body: a gateway in front of Slack whose upstream posted it.
	StatusAfterEffect int
}

// Start starts a fake on loopback, closed when t's test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	f := &Server{
		t:        t,
		opts:     opts,
		channels: map[string][]*Message{},
		plans:    map[string][]Plan{},
		posts:    map[string]int{},
		lookups:  map[string]int{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/chat.postMessage", f.postMessage)
	mux.HandleFunc("/api/conversations.history", f.history)
	mux.HandleFunc("/api/conversations.replies", f.replies)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

// APIBase is the fake's Web API root, with a trailing slash.
func (f *Server) APIBase() string { return f.srv.URL + "/api/" }

// Plan scripts the next chat.postMessage requests for key.
func (f *Server) Plan(key string, plans ...Plan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plans[key] = append(f.plans[key], plans...)
}

// PlanLookup scripts the next conversations.history or conversations.replies requests.
func (f *Server) PlanLookup(plans ...Plan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.historyF = append(f.historyF, plans...)
}

// CapLimit makes history and replies pages hold at most n messages whatever limit asks,
// as Slack does (it may return fewer than asked; for apps outside its Marketplace, at
// most 15).
func (f *Server) CapLimit(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.maxLimit = n
}

// Effects counts the stored messages whose metadata carries key, in every channel.
func (f *Server) Effects(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, msgs := range f.channels {
		for _, m := range msgs {
			if m.key == key {
				n++
			}
		}
	}
	return n
}

// TS is the ts of the first stored message whose metadata carries key, in any channel,
// or "" if there is none.
func (f *Server) TS(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	earliest := ""
	for _, msgs := range f.channels {
		for _, m := range msgs {
			// ts are unique over the whole fake and grow with each message stored.
			if m.key == key && (earliest == "" || tsAfter(earliest, m.TS)) {
				earliest = m.TS
			}
		}
	}
	return earliest
}

// Posts counts chat.postMessage requests for key.
func (f *Server) Posts(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.posts[key]
}

// Lookups counts history and replies requests for channel.
func (f *Server) Lookups(channel string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups[channel]
}

// Messages returns channel's messages, oldest first.
func (f *Server) Messages(channel string) []Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Message, 0, len(f.channels[channel]))
	for _, m := range f.channels[channel] {
		out = append(out, *m)
	}
	return out
}

// LastForm returns the parameters of the latest chat.postMessage request.
func (f *Server) LastForm() map[string][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.forms) == 0 {
		return nil
	}
	return f.forms[len(f.forms)-1]
}

// Delete removes channel's message ts, as a person deleting it does; its replies stay.
func (f *Server) Delete(channel, ts string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.channels[channel] = slices.DeleteFunc(f.channels[channel], func(m *Message) bool { return m.TS == ts })
}

// Seed stores a message that carries no key, as other posters' messages do.
func (f *Server) Seed(channel, text string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.store(channel, &Message{Text: text})
}

// store keeps m with a ts taken from the wall clock, as Slack's are (a message's ts is
// when it was posted), one microsecond after the previous one at least.
func (f *Server) store(channel string, m *Message) {
	f.storeAt(channel, m, time.Now())
}

// SeedAt stores a message without a key as posted at 'at' (or just after the latest
// message, if that is later), as a message from before the row's first attempt.
func (f *Server) SeedAt(channel, text string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.storeAt(channel, &Message{Text: text}, at)
}

func (f *Server) storeAt(channel string, m *Message, at time.Time) {
	now := at.Truncate(time.Microsecond)
	if !now.After(f.lastTS) {
		now = f.lastTS.Add(time.Microsecond)
	}
	f.lastTS = now
	m.TS = fmt.Sprintf("%d.%06d", now.Unix(), now.Nanosecond()/1000)
	f.channels[channel] = append(f.channels[channel], m)
}

// tsAfter reports whether message ts is after oldest (Slack's "oldest", exclusive); an
// empty oldest holds every message.
func tsAfter(ts, oldest string) bool {
	if oldest == "" {
		return true
	}
	a, _ := strconv.ParseFloat(ts, 64)
	b, _ := strconv.ParseFloat(oldest, 64)
	return a > b
}

// params reads a request's parameters the way Slack does: the query, a form body or a
// JSON body (whose non-string values keep their JSON text).
func params(r *http.Request) (map[string][]string, error) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "application/json" {
		var body map[string]json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			return nil, err
		}
		out := map[string][]string{}
		for k, v := range body {
			var s string
			if json.Unmarshal(v, &s) == nil {
				out[k] = []string{s}
			} else {
				out[k] = []string{string(v)}
			}
		}
		for k, v := range r.URL.Query() {
			out[k] = append(out[k], v...)
		}
		return out, nil
	}
	if err := r.ParseForm(); err != nil {
		return nil, err
	}
	return r.Form, nil
}

func first(p map[string][]string, k string) string {
	if v := p[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(v)
}

func slackError(w http.ResponseWriter, code string) {
	writeJSON(w, map[string]any{"ok": false, "error": code})
}

// authorized checks the token: a bearer header or, as slack-go sends it, a form field.
func authorized(r *http.Request, p map[string][]string) bool {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return tok == Token
	}
	return first(p, "token") == Token
}

// answerPlan writes a scripted answer, if it is one that needs no effect.
func answerPlan(w http.ResponseWriter, p Plan) bool {
	switch {
	case p.Status != 0:
		if p.RetryAfter != "" {
			w.Header().Set("Retry-After", p.RetryAfter)
		}
		http.Error(w, "<html>scripted</html>", p.Status)
		return true
	case p.Error != "":
		slackError(w, p.Error)
		return true
	case p.Body != "":
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(p.Body))
		return true
	}
	return false
}

func validChannel(ch string) bool {
	return len(ch) >= 3 && strings.ContainsRune("CGD", rune(ch[0])) && strings.ToUpper(ch) == ch
}

func (f *Server) postMessage(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodGet {
		http.Error(w, "method", http.StatusMethodNotAllowed)
		return
	}
	p, err := params(r)
	if err != nil {
		slackError(w, "invalid_form_data")
		return
	}
	if !authorized(r, p) {
		slackError(w, "invalid_auth")
		return
	}
	channel := first(p, "channel")
	msg := &Message{Text: first(p, "text"), ThreadTS: first(p, "thread_ts")}
	if b := first(p, "blocks"); b != "" {
		if err := json.Unmarshal([]byte(b), &msg.Blocks); err != nil {
			slackError(w, "invalid_blocks")
			return
		}
	}
	if raw := first(p, "metadata"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &msg.Metadata); err != nil {
			slackError(w, "invalid_metadata_format")
			return
		}
		if msg.Metadata["event_type"] == EventType {
			if ep, ok := msg.Metadata["event_payload"].(map[string]any); ok {
				msg.key, _ = ep[KeyField].(string)
			}
		}
	}

	f.mu.Lock()
	f.forms = append(f.forms, p)
	f.posts[msg.key]++
	var plan Plan
	if ps := f.plans[msg.key]; len(ps) > 0 {
		plan, f.plans[msg.key] = ps[0], ps[1:]
	}
	f.mu.Unlock()

	if answerPlan(w, plan) {
		return
	}
	if !validChannel(channel) {
		slackError(w, "channel_not_found")
		return
	}
	if msg.Text == "" && msg.Blocks == nil {
		slackError(w, "no_text")
		return
	}

	f.mu.Lock()
	// A thread_ts naming a reply posts in its parent's thread, as Slack does: a thread
	// has one level, and the reply's thread_ts names its parent. One naming a message
	// that is gone, with no replies left to keep its thread, posts the reply as a
	// message of the channel's own, without a word (see slack-go's
	// PostMessageWithResponseContext).
	if ts := msg.ThreadTS; ts != "" {
		msg.ThreadTS = ""
		for _, m := range f.channels[channel] {
			switch {
			case m.TS == ts:
				msg.ThreadTS = cmp.Or(m.ThreadTS, m.TS)
			case m.ThreadTS == ts:
				msg.ThreadTS = ts
			}
		}
	}
	f.store(channel, msg)
	f.mu.Unlock()
	if f.opts.OnPostFunc != nil {
		f.opts.OnPostFunc(msg.key)
	}

	switch {
	case plan.DropAfterEffect:
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			f.t.Errorf("fake slack: hijack: %v", err)
			return
		}
		_ = conn.Close()
		return
	case plan.HangAfterEffect:
		<-r.Context().Done() // the client gave up and closed the connection
		return
	case plan.StatusAfterEffect != 0:
		http.Error(w, "<html>scripted gateway answer</html>", plan.StatusAfterEffect)
		return
	}
	writeJSON(w, map[string]any{"ok": true, "channel": channel, "ts": msg.TS, "message": msg})
}

func (f *Server) lookup(w http.ResponseWriter, r *http.Request) (map[string][]string, string, bool) {
	p, err := params(r)
	if err != nil {
		slackError(w, "invalid_form_data")
		return nil, "", false
	}
	if !authorized(r, p) {
		slackError(w, "invalid_auth")
		return nil, "", false
	}
	channel := first(p, "channel")
	f.mu.Lock()
	f.lookups[channel]++
	var plan Plan
	if len(f.historyF) > 0 {
		plan, f.historyF = f.historyF[0], f.historyF[1:]
	}
	f.mu.Unlock()
	if answerPlan(w, plan) {
		return nil, "", false
	}
	if !validChannel(channel) {
		slackError(w, "channel_not_found")
		return nil, "", false
	}
	return p, channel, true
}

// view is a stored message as history shows it: metadata only when asked for.
func view(m *Message, withMetadata bool) Message {
	v := *m
	if !withMetadata {
		v.Metadata = nil
	}
	return v
}

func wantsMetadata(p map[string][]string) bool {
	b, _ := strconv.ParseBool(first(p, "include_all_metadata"))
	return b
}

func (f *Server) limit(p map[string][]string) int {
	n, err := strconv.Atoi(first(p, "limit"))
	if err != nil || n <= 0 {
		n = 100
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.maxLimit > 0 {
		n = min(n, f.maxLimit)
	}
	return n
}

// history answers newest first, top-level messages only (thread replies are not in a
// channel's history), at most limit of them, from a cursor (an offset), only those after
// "oldest" when given.
func (f *Server) history(w http.ResponseWriter, r *http.Request) {
	p, channel, ok := f.lookup(w, r)
	if !ok {
		return
	}
	meta := wantsMetadata(p)
	n := f.limit(p)
	offset, _ := strconv.Atoi(first(p, "cursor"))
	oldest := first(p, "oldest")
	f.mu.Lock()
	all := []Message{} // Slack answers "messages": [] for none, never null or nothing
	for _, m := range slices.Backward(f.channels[channel]) {
		if m.ThreadTS != "" && m.ThreadTS != m.TS {
			continue
		}
		if !tsAfter(m.TS, oldest) {
			continue
		}
		all = append(all, view(m, meta))
	}
	f.mu.Unlock()
	offset = min(offset, len(all))
	end := min(offset+n, len(all))
	resp := map[string]any{"ok": true, "messages": all[offset:end], "has_more": end < len(all)}
	if end < len(all) {
		resp["response_metadata"] = map[string]any{"next_cursor": strconv.Itoa(end)}
	}
	writeJSON(w, resp)
}

// replies answers a thread oldest first, paged by a cursor that is an offset. Given the
// ts of a reply, it answers that reply alone, as Slack does (slackapi/bolt-python#783),
// though its documentation says a reply's ts names the thread too.
func (f *Server) replies(w http.ResponseWriter, r *http.Request) {
	p, channel, ok := f.lookup(w, r)
	if !ok {
		return
	}
	ts := first(p, "ts")
	meta := wantsMetadata(p)
	n := f.limit(p)
	offset, _ := strconv.Atoi(first(p, "cursor"))
	f.mu.Lock()
	var thread []Message
	oldest := first(p, "oldest")
	for _, m := range f.channels[channel] {
		if m.TS == ts || (m.ThreadTS == ts && tsAfter(m.TS, oldest)) {
			thread = append(thread, view(m, meta))
		}
	}
	f.mu.Unlock()
	if len(thread) == 0 {
		slackError(w, "thread_not_found")
		return
	}
	offset = min(offset, len(thread))
	end := min(offset+n, len(thread))
	resp := map[string]any{"ok": true, "messages": thread[offset:end], "has_more": end < len(thread)}
	if end < len(thread) {
		resp["response_metadata"] = map[string]any{"next_cursor": strconv.Itoa(end)}
	}
	writeJSON(w, resp)
}
