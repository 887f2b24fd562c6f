package payment_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeStripe is a recording, Stripe-compatible API on loopback that enforces
// idempotency keys the way Stripe does: the first request with a key performs the
// effect and stores the answer; a later request with the same key and the same
// parameters gets the stored answer back (with Idempotent-Replayed: true) and performs
// nothing; with other parameters it gets a 400 idempotency_error.
type fakeStripe struct {
	srv *httptest.Server

	mu       sync.Mutex
	effects  map[string]int
	requests map[string][]recorded
	stored   map[string]stored
	plans    map[string][]action
	seq      int
}

// recorded is one request as the fake saw it.
type recorded struct {
	Path   string
	Form   url.Values
	Header http.Header
}

type stored struct {
	path, form string
	body       string
}

// action scripts the fake's next answer for a key. The zero action answers normally.
type action struct {
	// Status, with Header and Body, is a canned answer given without any effect.
	Status int
	Header http.Header
	Body   string
	// DropBeforeEffect closes the connection without acting or answering.
	DropBeforeEffect bool
	// DropAfterEffect acts (and stores the answer), then closes the connection
	// without answering.
	DropAfterEffect bool
	// CutBody, with Status, sends the status line, the headers and half the body, then
	// closes the connection: the answer's body is lost on the way.
	CutBody bool
}

func startFake(t *testing.T) *fakeStripe {
	t.Helper()
	f := &fakeStripe{
		effects:  map[string]int{},
		requests: map[string][]recorded{},
		stored:   map[string]stored{},
		plans:    map[string][]action{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve)) // 127.0.0.1
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeStripe) URL() string { return f.srv.URL }

// Plan queues actions for the next requests carrying key.
func (f *fakeStripe) Plan(key string, as ...action) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plans[key] = append(f.plans[key], as...)
}

// Effects reports how many times the fake acted for key.
func (f *fakeStripe) Effects(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.effects[key]
}

// Requests returns the requests that carried key, in order.
func (f *fakeStripe) Requests(key string) []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.requests[key]...)
}

func (f *fakeStripe) serve(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Method != http.MethodPost {
		writeJSON(w, http.StatusBadRequest, nil, `{"error":{"type":"invalid_request_error","message":"bad request"}}`)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	form := r.PostForm.Encode() // sorted, so equal parameters compare equal

	f.mu.Lock()
	f.requests[key] = append(f.requests[key], recorded{Path: r.URL.Path, Form: r.PostForm, Header: r.Header.Clone()})
	var act action
	if q := f.plans[key]; len(q) > 0 {
		act, f.plans[key] = q[0], q[1:]
	}
	switch {
	case act.DropBeforeEffect:
		f.mu.Unlock()
		drop(w)
		return
	case act.Status != 0 && act.CutBody:
		f.mu.Unlock()
		cutJSON(w, act.Status, act.Header, act.Body)
		return
	case act.Status != 0:
		f.mu.Unlock()
		writeJSON(w, act.Status, act.Header, act.Body)
		return
	}
	if s, ok := f.stored[key]; ok && key != "" {
		f.mu.Unlock()
		if s.path != r.URL.Path || s.form != form {
			writeJSON(w, http.StatusBadRequest, nil, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '`+key+`' if you meant to execute a different request."}}`)
			return
		}
		writeJSON(w, http.StatusOK, http.Header{"Idempotent-Replayed": {"true"}}, s.body)
		return
	}
	f.effects[key]++
	f.seq++
	body, status := object(r.URL.Path, r.PostForm, f.seq)
	if status == http.StatusOK && key != "" {
		f.stored[key] = stored{path: r.URL.Path, form: form, body: body}
	}
	f.mu.Unlock()

	if act.DropAfterEffect {
		drop(w)
		return
	}
	writeJSON(w, status, nil, body)
}

// object is the fake's answer to a call on path.
func object(path string, form url.Values, seq int) (string, int) {
	amount := form.Get("amount")
	if amount == "" {
		amount = "1000"
	}
	currency := form.Get("currency")
	if currency == "" {
		currency = "usd"
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case path == "/v1/payment_intents":
		return fmt.Sprintf(`{"id":"pi_fake%d","object":"payment_intent","status":"requires_payment_method","amount":%s,"currency":%q,"livemode":false}`,
			seq, amount, currency), http.StatusOK
	case len(parts) == 4 && parts[1] == "payment_intents" && parts[3] == "confirm":
		return fmt.Sprintf(`{"id":%q,"object":"payment_intent","status":"succeeded","amount":1000,"currency":"usd","livemode":false}`, parts[2]), http.StatusOK
	case len(parts) == 4 && parts[1] == "payment_intents" && parts[3] == "cancel":
		return fmt.Sprintf(`{"id":%q,"object":"payment_intent","status":"canceled","amount":1000,"currency":"usd","livemode":false}`, parts[2]), http.StatusOK
	case path == "/v1/refunds":
		return fmt.Sprintf(`{"id":"re_fake%d","object":"refund","status":"succeeded","amount":%s,"currency":"usd"}`, seq, amount), http.StatusOK
	case path == "/v1/customers":
		return fmt.Sprintf(`{"id":"cus_fake%d","object":"customer","livemode":false,"email":%q}`, seq, form.Get("email")), http.StatusOK
	default:
		return `{"error":{"type":"invalid_request_error","message":"Unrecognized request URL"}}`, http.StatusNotFound
	}
}

func writeJSON(w http.ResponseWriter, status int, header http.Header, body string) {
	for k, vs := range header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Request-Id", "req_fake")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// cutJSON starts the answer writeJSON gives, with a Content-Length for the whole body,
// and closes the connection after half the body.
func cutJSON(w http.ResponseWriter, status int, header http.Header, body string) {
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	for k, vs := range header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_fake")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body[:len(body)/2]))
	w.(http.Flusher).Flush()
	drop(w)
}

// drop closes the connection without an answer.
func drop(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err) // httptest's HTTP/1.1 server always supports Hijack
	}
	_ = conn.Close()
}
