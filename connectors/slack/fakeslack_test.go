package slack_test

import (
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

const (
	testToken = "xoxb-1234-5678-secretpart"
	// The fake's idea of the metadata that carries a key; the connector's exported
	// constants are checked against these in the tests.
	fakeEventType = "outboxd_intent"
	fakeKeyField  = "idempotency_key"
)

// fakeSlack is a Slack Web API on loopback, just enough of chat.postMessage,
// conversations.history and conversations.replies for slack-go: it takes the token as
// slack-go sends it (a "token" form field) or as a bearer header, reads form or JSON
// bodies, and keeps every posted message with its metadata, per channel.
type fakeSlack struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	seq      int
	lastTS   time.Time                 // the latest message's time: ts are the wall clock, unique
	channels map[string][]*fakeMessage // oldest first
	plans    map[string][]fakePlan     // by idempotency key, consumed in order
	posts    map[string]int            // chat.postMessage requests by key
	lookups  map[string]int            // history and replies requests by channel
	historyF []fakePlan                // plans for the next history/replies requests
	forms    []map[string][]string     // every chat.postMessage request's parameters
	maxLimit int                       // the most messages a history or replies page holds, if set
}

type fakeMessage struct {
	TS       string         `json:"ts"`
	ThreadTS string         `json:"thread_ts,omitempty"`
	Text     string         `json:"text,omitempty"`
	Blocks   any            `json:"blocks,omitempty"`
	Metadata map[string]any `json:"metadata,omitempty"`
	key      string
}

// fakePlan scripts the answer to one request.
type fakePlan struct {
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

func startFakeSlack(t *testing.T) *fakeSlack {
	t.Helper()
	f := &fakeSlack{
		t:        t,
		channels: map[string][]*fakeMessage{},
		plans:    map[string][]fakePlan{},
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
func (f *fakeSlack) APIBase() string { return f.srv.URL + "/api/" }

// Plan scripts the next chat.postMessage requests for key.
func (f *fakeSlack) Plan(key string, plans ...fakePlan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plans[key] = append(f.plans[key], plans...)
}

// PlanLookup scripts the next conversations.history or conversations.replies requests.
func (f *fakeSlack) PlanLookup(plans ...fakePlan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.historyF = append(f.historyF, plans...)
}

// CapLimit makes history and replies pages hold at most n messages whatever limit asks,
// as Slack does (it may return fewer than asked; for apps outside its Marketplace, at
// most 15).
func (f *fakeSlack) CapLimit(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.maxLimit = n
}

// Effects counts the stored messages whose metadata carries key, in every channel.
func (f *fakeSlack) Effects(key string) int {
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

// Posts counts chat.postMessage requests for key.
func (f *fakeSlack) Posts(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.posts[key]
}

// Lookups counts history and replies requests for channel.
func (f *fakeSlack) Lookups(channel string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups[channel]
}

// Messages returns channel's messages, oldest first.
func (f *fakeSlack) Messages(channel string) []fakeMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]fakeMessage, 0, len(f.channels[channel]))
	for _, m := range f.channels[channel] {
		out = append(out, *m)
	}
	return out
}

// LastForm returns the parameters of the latest chat.postMessage request.
func (f *fakeSlack) LastForm() map[string][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.forms) == 0 {
		return nil
	}
	return f.forms[len(f.forms)-1]
}

// Delete removes channel's message ts, as a person deleting it does; its replies stay.
func (f *fakeSlack) Delete(channel, ts string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.channels[channel] = slices.DeleteFunc(f.channels[channel], func(m *fakeMessage) bool { return m.TS == ts })
}

// Seed stores a message that carries no key, as other posters' messages do.
func (f *fakeSlack) Seed(channel, text string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.store(channel, &fakeMessage{Text: text})
}

// store keeps m with a ts taken from the wall clock, as Slack's are (a message's ts is
// when it was posted), one microsecond after the previous one at least.
func (f *fakeSlack) store(channel string, m *fakeMessage) {
	f.storeAt(channel, m, time.Now())
}

// SeedAt stores a message without a key as posted at 'at' (or just after the latest
// message, if that is later), as a message from before the row's first attempt.
func (f *fakeSlack) SeedAt(channel, text string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.storeAt(channel, &fakeMessage{Text: text}, at)
}

func (f *fakeSlack) storeAt(channel string, m *fakeMessage, at time.Time) {
	f.seq++
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
		return tok == testToken
	}
	return first(p, "token") == testToken
}

// answerPlan writes a scripted answer, if it is one that needs no effect.
func answerPlan(w http.ResponseWriter, p fakePlan) bool {
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

func (f *fakeSlack) postMessage(w http.ResponseWriter, r *http.Request) {
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
	msg := &fakeMessage{Text: first(p, "text"), ThreadTS: first(p, "thread_ts")}
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
		if msg.Metadata["event_type"] == fakeEventType {
			if ep, ok := msg.Metadata["event_payload"].(map[string]any); ok {
				msg.key, _ = ep[fakeKeyField].(string)
			}
		}
	}

	f.mu.Lock()
	f.forms = append(f.forms, p)
	f.posts[msg.key]++
	var plan fakePlan
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
				msg.ThreadTS = cmpOr(m.ThreadTS, m.TS)
			case m.ThreadTS == ts:
				msg.ThreadTS = ts
			}
		}
	}
	f.store(channel, msg)
	f.mu.Unlock()

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

func (f *fakeSlack) lookup(w http.ResponseWriter, r *http.Request) (map[string][]string, string, bool) {
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
	var plan fakePlan
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
func view(m *fakeMessage, withMetadata bool) fakeMessage {
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

func (f *fakeSlack) limit(p map[string][]string) int {
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
func (f *fakeSlack) history(w http.ResponseWriter, r *http.Request) {
	p, channel, ok := f.lookup(w, r)
	if !ok {
		return
	}
	meta := wantsMetadata(p)
	n := f.limit(p)
	offset, _ := strconv.Atoi(first(p, "cursor"))
	oldest := first(p, "oldest")
	f.mu.Lock()
	var all []fakeMessage
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
func (f *fakeSlack) replies(w http.ResponseWriter, r *http.Request) {
	p, channel, ok := f.lookup(w, r)
	if !ok {
		return
	}
	ts := first(p, "ts")
	meta := wantsMetadata(p)
	n := f.limit(p)
	offset, _ := strconv.Atoi(first(p, "cursor"))
	f.mu.Lock()
	var thread []fakeMessage
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
