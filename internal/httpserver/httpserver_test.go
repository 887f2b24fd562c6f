package httpserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestEndpoints(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		server   *Server
		readyErr error
		registry *prometheus.Registry
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		b := &testBundle{registry: prometheus.NewRegistry()}
		counter := prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_test_total", Help: "A test counter."})
		counter.Add(3)
		b.registry.MustRegister(counter)
		b.server = New(&Config{
			ReadyFunc: func(context.Context) error { return b.readyErr },
			Gatherer:  b.registry,
			Logger:    slog.New(slog.DiscardHandler),
		})
		return b
	}
	get := func(t *testing.T, h http.Handler, method, target string) (int, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), method, target, nil))
		return rec.Code, rec.Body.String()
	}

	t.Run("Healthz", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.readyErr = errors.New("database down")
		code, body := get(t, b.server.Handler(), http.MethodGet, "/healthz")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "ok\n", body)
	})

	t.Run("Ready", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, body := get(t, b.server.Handler(), http.MethodGet, "/readyz")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "ready\n", body)
	})

	t.Run("NotReady", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.readyErr = errors.New("listen connection: not connected")
		code, body := get(t, b.server.Handler(), http.MethodGet, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Equal(t, "not ready: listen connection: not connected\n", body)
	})

	t.Run("ReadyTimeout", func(t *testing.T) {
		t.Parallel()
		s := New(&Config{
			ReadyFunc: func(ctx context.Context) error {
				<-ctx.Done()
				return ctx.Err()
			},
			ReadyTimeout: 10 * time.Millisecond,
			Logger:       slog.New(slog.DiscardHandler),
		})
		code, body := get(t, s.Handler(), http.MethodGet, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Equal(t, "not ready: readiness check took longer than 10ms: context deadline exceeded\n", body)
	})

	t.Run("Metrics", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, body := get(t, b.server.Handler(), http.MethodGet, "/metrics")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "# HELP outbox_test_total A test counter.\n")
		require.Contains(t, body, "outbox_test_total 3\n")
	})

	t.Run("Handle", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.server.Handle("POST /v1/intents", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusCreated)
		}))
		code, _ := get(t, b.server.Handler(), http.MethodPost, "/v1/intents")
		require.Equal(t, http.StatusCreated, code)
	})

	t.Run("MethodsAndUnknownPaths", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, _ := get(t, b.server.Handler(), http.MethodPost, "/healthz")
		require.Equal(t, http.StatusMethodNotAllowed, code)
		code, _ = get(t, b.server.Handler(), http.MethodHead, "/readyz")
		require.Equal(t, http.StatusOK, code)
		code, _ = get(t, b.server.Handler(), http.MethodGet, "/")
		require.Equal(t, http.StatusNotFound, code)
	})
}

func TestLimits(t *testing.T) {
	t.Parallel()

	s := New(&Config{})
	require.Equal(t, "127.0.0.1:8080", s.server.Addr)
	require.Equal(t, ReadHeaderTimeout, s.server.ReadHeaderTimeout)
	require.Equal(t, ReadTimeout, s.server.ReadTimeout)
	require.Equal(t, WriteTimeout, s.server.WriteTimeout)
	require.Equal(t, IdleTimeout, s.server.IdleTimeout)
	require.Equal(t, MaxHeaderBytes, s.server.MaxHeaderBytes)
	for _, d := range []time.Duration{ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout} {
		require.Positive(t, d)
	}
	require.NotNil(t, s.server.ErrorLog)
}

func TestServe(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		server  *Server
		url     string
		cancel  context.CancelFunc
		served  chan error
		entered chan struct{} // a /slow request has started
		release chan struct{} // lets /slow requests finish
	}
	setup := func(t *testing.T, shutdownTimeout time.Duration) *testBundle {
		t.Helper()
		b := &testBundle{
			served:  make(chan error, 1),
			entered: make(chan struct{}, 1),
			release: make(chan struct{}),
		}
		b.server = New(&Config{ShutdownTimeout: shutdownTimeout, Logger: slog.New(slog.DiscardHandler)})
		b.server.Handle("GET /slow", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.entered <- struct{}{}
			select {
			case <-b.release:
			case <-r.Context().Done():
			}
			_, _ = io.WriteString(w, "done")
		}))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		b.url = "http://" + ln.Addr().String()
		ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
		b.cancel = cancel
		go func() { b.served <- b.server.Serve(ctx, ln) }()
		t.Cleanup(func() {
			cancel()
			select {
			case <-b.served:
			case <-time.After(10 * time.Second):
				t.Error("Serve did not return")
			}
		})
		return b
	}
	wait := func(t *testing.T, b *testBundle) error {
		t.Helper()
		select {
		case err := <-b.served:
			b.served <- err // for the cleanup
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return")
			return nil
		}
	}

	t.Run("StopsCleanly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		resp, err := http.Get(b.url + "/healthz")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, "ok\n", string(body))

		b.cancel()
		require.NoError(t, wait(t, b))
		_, err = http.Get(b.url + "/healthz")
		require.Error(t, err, "the listener is closed")
	})

	t.Run("LetsRequestsFinish", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 10*time.Second)
		got := make(chan string, 1)
		go func() {
			resp, err := http.Get(b.url + "/slow")
			if err != nil {
				got <- err.Error()
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			got <- string(body)
		}()
		<-b.entered
		b.cancel()
		close(b.release)
		require.NoError(t, wait(t, b))
		require.Equal(t, "done", <-got)
	})

	t.Run("ShutdownTimeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 20*time.Millisecond)
		failed := make(chan error, 1)
		go func() {
			resp, err := http.Get(b.url + "/slow")
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			failed <- err
		}()
		<-b.entered
		b.cancel()
		require.NoError(t, wait(t, b), "a request cut off at the timeout is the client's loss, not a failure to stop")
		require.Error(t, <-failed, "the connection was cut")
	})

	// The MCP SDK opens its event stream for an Accept of */* or text/*, in any case or
	// split over header lines, as curl sends it; shutdown looked only for the text
	// "text/event-stream" in the first Accept line, and such a stream held it for the
	// whole shutdown timeout.
	t.Run("EndsEventStreamsWhateverTheAccept", func(t *testing.T) {
		t.Parallel()
		for name, accept := range map[string][]string{
			"EventStream": {"text/event-stream"},
			"Any":         {"*/*"},
			"Text":        {"text/*"},
			"UpperCase":   {"TEXT/EVENT-STREAM"},
			"TwoLines":    {"application/json", "text/event-stream"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, time.Minute) // longer than wait's limit: the stream must not hold shutdown
				ended := make(chan struct{})
				b.server.Handle("GET /stream", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					http.NewResponseController(w).Flush() //nolint:errcheck // the test reads the headers
					<-r.Context().Done()
					close(ended)
				}))
				req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.url+"/stream", nil)
				require.NoError(t, err)
				req.Header["Accept"] = accept
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()

				b.cancel()
				require.NoError(t, wait(t, b))
				<-ended
			})
		}
	})
}

func TestRunListenError(t *testing.T) {
	t.Parallel()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()

	// The address is taken: Run fails at once instead of serving.
	s := New(&Config{Addr: ln.Addr().String(), Logger: slog.New(slog.DiscardHandler)})
	err = s.Run(t.Context())
	require.ErrorContains(t, err, "listen: ")
	require.True(t, strings.Contains(err.Error(), "address already in use"), err.Error())
}

// /readyz needs no token, and each check may hold one of the database pool's connections,
// or dial a new one, until ReadyTimeout: requests in parallel, while the database is
// slow, each ran a check of their own and took the connections the relay writes outcomes
// on. Requests that come while a check runs share its answer, so checks never overlap.
func TestReadyChecksDoNotOverlap(t *testing.T) {
	t.Parallel()
	var (
		running, overlaps atomic.Int32
		overlapped        = make(chan struct{})
		once              sync.Once
	)
	s := New(&Config{
		ReadyFunc: func(ctx context.Context) error {
			if running.Add(1) > 1 {
				overlaps.Add(1)
				once.Do(func() { close(overlapped) })
			}
			defer running.Add(-1)
			select {
			case <-ctx.Done(): // a database that does not answer
			case <-overlapped:
			}
			return errors.New("database slow")
		},
		ReadyTimeout: time.Second,
		Logger:       slog.New(slog.DiscardHandler),
	})
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/readyz", nil))
			codes[i] = rec.Code
		})
	}
	wg.Wait()
	require.Zero(t, overlaps.Load(), "readiness checks ran at the same time")
	for _, code := range codes {
		require.Equal(t, http.StatusServiceUnavailable, code)
	}
}
