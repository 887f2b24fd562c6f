package payment_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// recordingStripe is a loopback server that answers every request with answer (a
// Stripe object) and records each request's URI and form body; take returns what it
// recorded since the last call.
func recordingStripe(t *testing.T, answer string) (url string, take func() (uris, bodies []string)) {
	t.Helper()
	var (
		mu           sync.Mutex
		uris, bodies []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		uris, bodies = append(uris, r.RequestURI), append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() ([]string, []string) {
		mu.Lock()
		defer mu.Unlock()
		u, b := uris, bodies
		uris, bodies = nil, nil
		return u, b
	}
}
