package email_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// fakeResend is a fake of Resend's POST /emails on loopback. It requires the bearer
// key and an Idempotency-Key, and enforces the key as Resend does: the same key with
// the same body gets the stored answer and sends nothing; the same key with another
// body gets 409 invalid_idempotent_request; the same key while its first request is in
// flight gets 409 concurrent_idempotent_requests. Failed requests do not store the key.
type fakeResend struct {
	srv    *httptest.Server
	apiKey string

	mu       sync.Mutex
	sent     map[string]int           // Idempotency-Key -> emails sent
	stored   map[string]storedAnswer  // Idempotency-Key -> the answer to replay
	inFlight map[string]bool          // Idempotency-Key -> a request is being handled
	drop     map[string]int           // Idempotency-Key -> sends to perform and then drop
	script   map[string][]scriptedAns // Idempotency-Key -> answers to give instead of acting
	bodies   []fakeRequest
}

type storedAnswer struct {
	body []byte // the request body
	id   string
}

type scriptedAns struct {
	status int
	header map[string]string
	body   string
}

// fakeRequest is one request the fake received.
type fakeRequest struct {
	Header http.Header
	Body   map[string]any
}

func startFakeResend(t *testing.T) *fakeResend {
	t.Helper()
	f := &fakeResend{
		apiKey:   "re_test_" + rand.Text()[:12],
		sent:     map[string]int{},
		stored:   map[string]storedAnswer{},
		inFlight: map[string]bool{},
		drop:     map[string]int{},
		script:   map[string][]scriptedAns{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeResend) URL() string { return f.srv.URL }

// Effects reports how many emails the fake sent for key.
func (f *fakeResend) Effects(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent[key]
}

// DropAfterEffect makes the fake send the next email for key and then close the
// connection without answering.
func (f *fakeResend) DropAfterEffect(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop[key]++
}

// Script makes the fake answer the next request for key with status, headers and body,
// without sending anything.
func (f *fakeResend) Script(key string, status int, header map[string]string, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script[key] = append(f.script[key], scriptedAns{status: status, header: header, body: body})
}

// Requests returns the requests received, in order.
func (f *fakeResend) Requests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeRequest(nil), f.bodies...)
}

// RequestsFor reports how many requests carried key as their Idempotency-Key (those
// refused before the key was read, for a bad API key, are not counted).
func (f *fakeResend) RequestsFor(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.bodies {
		if r.Header.Get("Idempotency-Key") == key {
			n++
		}
	}
	return n
}

func resendError(w http.ResponseWriter, status int, name, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"statusCode": status, "name": name, "message": message})
}

func (f *fakeResend) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/emails" {
		resendError(w, http.StatusNotFound, "not_found", "The requested endpoint does not exist.")
		return
	}
	switch auth := r.Header.Get("Authorization"); {
	case auth == "":
		resendError(w, http.StatusUnauthorized, "missing_api_key", "Missing API key in the authorization header.")
		return
	case auth != "Bearer "+f.apiKey:
		resendError(w, http.StatusForbidden, "invalid_api_key", "API key is invalid.")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 256 {
		// Resend makes the key optional; this fake requires it, to prove it is sent.
		resendError(w, http.StatusBadRequest, "invalid_idempotency_key", "The key must be between 1-256 chars.")
		return
	}
	var fields struct {
		From    string            `json:"from"`
		To      []string          `json:"to"`
		Cc      []string          `json:"cc"`
		Bcc     []string          `json:"bcc"`
		ReplyTo []string          `json:"reply_to"`
		Subject string            `json:"subject"`
		Text    string            `json:"text"`
		HTML    string            `json:"html"`
		Headers map[string]string `json:"headers"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fields); err != nil {
		resendError(w, http.StatusUnprocessableEntity, "validation_error", "Invalid body: "+err.Error())
		return
	}
	var generic map[string]any
	_ = json.Unmarshal(body, &generic)

	f.mu.Lock()
	f.bodies = append(f.bodies, fakeRequest{Header: r.Header.Clone(), Body: generic})
	if s := f.script[key]; len(s) > 0 {
		f.script[key] = s[1:]
		f.mu.Unlock()
		for k, v := range s[0].header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s[0].status)
		_, _ = io.WriteString(w, s[0].body)
		return
	}
	if st, ok := f.stored[key]; ok {
		f.mu.Unlock()
		if !bytes.Equal(st.body, body) {
			resendError(w, http.StatusConflict, "invalid_idempotent_request",
				"Same idempotency key used with a different request payload. Change your idempotency key or payload.")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":%q}`, st.id)
		return
	}
	if f.inFlight[key] {
		f.mu.Unlock()
		resendError(w, http.StatusConflict, "concurrent_idempotent_requests",
			"Same idempotency key used while original request is still in progress. Try the request again later.")
		return
	}
	if fields.From == "" || len(fields.To) == 0 || fields.Subject == "" {
		f.mu.Unlock()
		resendError(w, http.StatusUnprocessableEntity, "validation_error", "The `from`, `to` and `subject` fields are required.")
		return
	}
	// Send.
	id := rand.Text()
	f.sent[key]++
	f.stored[key] = storedAnswer{body: body, id: id}
	drop := f.drop[key] > 0
	if drop {
		f.drop[key]--
	}
	f.mu.Unlock()

	if drop {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"id":%q}`, id)
}
