// Package httpserver is the HTTP side of `outboxd serve`: liveness, readiness and
// Prometheus metrics on one mux, onto which the intent API is mounted with
// [Server.Handle].
//
// # Endpoints
//
//   - GET /healthz answers 200 "ok" while the process runs.
//   - GET /readyz answers 200 "ready" when [Config.ReadyFunc] returns nil, and 503 with
//     its error otherwise.
//   - GET /metrics serves [Config.Gatherer] in the Prometheus exposition formats.
//
// # Timeouts
//
// The server bounds reading a request and writing a response (see the constants), so a
// slow or stalled client cannot hold a connection. A handler that streams for longer,
// such as a server-sent events stream, extends its own deadline with
// [http.ResponseController.SetWriteDeadline].
package httpserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/singleflight"
)

// Limits of every connection.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 30 * time.Second
	IdleTimeout       = 2 * time.Minute
	MaxHeaderBytes    = 64 << 10
)

// Config configures a [Server]. A zero field means its default.
type Config struct {
	// Addr is the host:port to listen on. Defaults to 127.0.0.1:8080.
	Addr string
	// ReadyFunc says whether the process can do its work: nil when it can, else an
	// error saying why not. /readyz requests that come while a call runs share its
	// answer. Defaults to always ready.
	ReadyFunc func(ctx context.Context) error
	// ReadyTimeout bounds one call of ReadyFunc. Defaults to 5s.
	ReadyTimeout time.Duration
	// Gatherer is what /metrics serves. Defaults to prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// ShutdownTimeout is how long requests in progress may finish once Run's context
	// is done, before their connections are closed. Defaults to 10s.
	ShutdownTimeout time.Duration
	// Logger receives the server's logs. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults() *Config {
	out := *c
	out.Addr = cmp.Or(c.Addr, "127.0.0.1:8080")
	if out.ReadyFunc == nil {
		out.ReadyFunc = func(context.Context) error { return nil }
	}
	out.ReadyTimeout = cmp.Or(c.ReadyTimeout, 5*time.Second)
	if out.Gatherer == nil {
		out.Gatherer = prometheus.DefaultGatherer
	}
	out.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 10*time.Second)
	out.Logger = cmp.Or(c.Logger, slog.Default())
	return &out
}

// Server serves the health, readiness and metrics endpoints, and whatever else is
// mounted on it.
type Server struct {
	cfg    *Config
	mux    *http.ServeMux
	server *http.Server
	// stopping is done once shutdown begins; event streams end with it.
	stopping context.Context
	// ready runs the readiness checks (see checkReady).
	ready singleflight.Group
}

// New returns a server with /healthz, /readyz and /metrics mounted. It does not listen
// until [Server.Run] or [Server.Serve].
func New(cfg *Config) *Server {
	cfg = cfg.withDefaults()
	stopping, stop := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, mux: http.NewServeMux(), stopping: stopping}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelError),
		// A collector that fails leaves out its own metrics, not everyone's.
		ErrorHandling: promhttp.ContinueOnError,
	}))
	s.server = &http.Server{
		Addr:              cfg.Addr,
		Handler:           s.endStreamsAtShutdown(s.mux),
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.server.RegisterOnShutdown(stop)
	return s
}

// endStreamsAtShutdown ends event streams when shutdown begins: GET requests answered
// with text/event-stream, such as the stream an MCP client keeps open on /mcp. They
// never finish by themselves, and shutdown would wait for them until its timeout.
// Other requests, which write rows, are left to finish. The stream is known by its
// answer rather than by the request's Accept, which the MCP SDK reads more loosely
// (*/*, text/*, any case, several lines) than a check here could keep up with.
func (s *Server) endStreamsAtShutdown(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			h.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		sw := &streamWriter{ResponseWriter: w, stopping: s.stopping, cancel: cancel}
		defer context.AfterFunc(s.stopping, func() {
			if sw.stream.Load() {
				cancel()
			}
		})()
		h.ServeHTTP(sw, r.WithContext(ctx))
	})
}

// streamWriter notes when the response it writes is an event stream, and then ends the
// request if shutdown has begun (endStreamsAtShutdown ends it if shutdown begins later).
type streamWriter struct {
	http.ResponseWriter
	stopping context.Context
	cancel   context.CancelFunc
	wrote    bool // the handler's goroutine only
	stream   atomic.Bool
}

func (w *streamWriter) WriteHeader(code int) {
	if code >= http.StatusOK { // not an informational answer, which headers follow
		w.check()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *streamWriter) Write(b []byte) (int, error) {
	w.check()
	return w.ResponseWriter.Write(b)
}

// Flush serves handlers that look for [http.Flusher]; [http.ResponseController] uses
// Unwrap.
func (w *streamWriter) Flush() {
	w.check()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the ResponseWriter for [http.ResponseController].
func (w *streamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// check reads the Content-Type once, as the headers are sent.
func (w *streamWriter) check() {
	if w.wrote {
		return
	}
	w.wrote = true
	mediaType, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type"))
	if mediaType != "text/event-stream" {
		return
	}
	// Set before reading stopping: either this or endStreamsAtShutdown's AfterFunc
	// sees the other.
	w.stream.Store(true)
	if w.stopping.Err() != nil {
		w.cancel()
	}
}

// Handle mounts h at pattern (net/http's ServeMux patterns, such as
// "POST /v1/intents"). Call it before Run.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns everything the server serves, for tests.
func (s *Server) Handler() http.Handler { return s.mux }

// Run listens on [Config.Addr] and serves until ctx is done, then shuts down as
// [Server.Serve] does. It fails at once when the address cannot be listened on.
func (s *Server) Run(ctx context.Context) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is done, then stops accepting connections, ends event
// streams, gives requests in progress until [Config.ShutdownTimeout] to finish, and
// closes what is left (with a warning: that is a client's loss, not the server's
// failure). It returns nil after a shutdown that ctx asked for, and ln is closed on
// return.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.cfg.Logger.InfoContext(ctx, "http server listening", "addr", ln.Addr().String())
	served := make(chan error, 1)
	go func() { served <- s.server.Serve(ln) }()

	select {
	case err := <-served:
		// Serve returns only when the listener fails.
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	shutdownCtx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout,
		errors.New("http shutdown timeout"))
	defer cancel()
	if err := s.server.Shutdown(shutdownCtx); err != nil {
		// Requests still running past the timeout: cut their connections.
		_ = s.server.Close()
		s.cfg.Logger.WarnContext(ctx, "requests still running at the shutdown timeout were cut off",
			"shutdown_timeout", s.cfg.ShutdownTimeout.String())
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = fmt.Fprintln(w, "ok")
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	err := s.checkReady(ctx)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		// Probes call this every few seconds: the reason is in the answer, and the
		// failing part logs its own problem once.
		s.cfg.Logger.DebugContext(ctx, "not ready", "err", err)
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
		return
	}
	_, _ = fmt.Fprintln(w, "ready")
}

// checkReady calls ReadyFunc, once for all the /readyz requests that come while a call
// runs, which share its answer. The endpoint needs no token, and a call may hold one of
// the database pool's connections (or dial a new one) until ReadyTimeout: requests in
// parallel, each with a call of its own, took the connections the relay and the intent
// API work on. The call is not bound to the request that made it, so that its client
// going away does not end the others' answer.
func (s *Server) checkReady(ctx context.Context) error {
	_, err, _ := s.ready.Do("", func() (any, error) {
		ctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), s.cfg.ReadyTimeout,
			fmt.Errorf("readiness check took longer than %s", s.cfg.ReadyTimeout))
		defer cancel()
		err := s.cfg.ReadyFunc(ctx)
		if err != nil && ctx.Err() != nil {
			// Name the timeout rather than a bare "context deadline exceeded".
			err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
		}
		return nil, err
	})
	return err
}
