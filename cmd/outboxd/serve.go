package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/outboxd/outboxd/connectors/email"
	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/api"
	"github.com/outboxd/outboxd/internal/config"
	"github.com/outboxd/outboxd/internal/httpserver"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/mcpserver"
	"github.com/outboxd/outboxd/relay"
)

func newServeCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the relay and its HTTP endpoints",
		Long: "serve delivers the outbox: it claims due rows in OUTBOX_DATABASE_URL, delivers them through the " +
			"configured connector instances, and records each outcome. It also serves /healthz, /readyz and " +
			"/metrics on OUTBOX_HTTP_ADDR, and with OUTBOX_API_TOKENS set the intent API (/v1/intents) and /mcp.\n\n" +
			"Everything is configured by environment variables (the README lists them all); at least one " +
			"connector instance is needed. SIGINT, SIGTERM or SIGHUP stops claiming and gives deliveries in flight " +
			"OUTBOX_SHUTDOWN_TIMEOUT to finish; a second signal exits at once.",
		Example: `  # the default webhook instance
  OUTBOX_DATABASE_URL=postgres://app@localhost/app \
  OUTBOX_WEBHOOK_URL=https://example.com/hooks/outbox \
  outboxd serve

  # two named webhook instances, one whose receiver dedupes on Idempotency-Key; JSON logs
  OUTBOX_DATABASE_URL='postgres://app@localhost/app?pool_max_conns=16' \
  OUTBOX_CONNECTORS=webhook:crm,webhook:billing \
  OUTBOX_WEBHOOK_CRM_URL=https://crm.example.com/hooks \
  OUTBOX_WEBHOOK_BILLING_URL=https://billing.example.com/hooks \
  OUTBOX_WEBHOOK_BILLING_GUARANTEE=enforced \
  OUTBOX_LOG_FORMAT=json \
  outboxd serve`,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), e) },
	}
}

// serve runs the relay and the HTTP server until a signal (or ctx) stops them.
func serve(ctx context.Context, e *env) (err error) {
	cfg, err := config.Load(e.environ)
	if err != nil {
		// Before the problems, which a misspelt variable often explains: the
		// OUTBOX_WEBHOOK_CRM_URL required, when OUTBOX_WEBHOOK_CRM_ULR is set. The log
		// settings may be among the problems: the defaults then.
		var cerr *config.Error
		if errors.As(err, &cerr) {
			logCfg, lerr := config.LoadLog(e.environ)
			if lerr != nil {
				logCfg = config.Log{}
			}
			warnUnknown(ctx, newLogger(e.stderr, logCfg), cerr.Unknown)
		}
		return usageError{err}
	}
	logger := newLogger(e.stderr, cfg.Log)
	if e.ownsProcess {
		// What the standard library says through the log package's default logger, such
		// as the webhook transport's "Unsolicited response received on idle HTTP
		// channel" for a receiver that answers twice, was a plain line among the JSON
		// ones, which a log pipeline cannot read; it goes through the command's handler.
		log.SetFlags(0)
		log.SetOutput(slog.NewLogLogger(logger.Handler(), slog.LevelWarn).Writer())
	}
	// First, as one may explain a problem below: OUTBOX_WEBHOK_URL creates no instance.
	warnUnknown(ctx, logger, cfg.Unknown)
	if len(cfg.Instances()) == 0 {
		return usagef("no connector instance is configured: set OUTBOX_WEBHOOK_URL for the default webhook " +
			"instance, or name instances in OUTBOX_CONNECTORS (webhook:crm reads OUTBOX_WEBHOOK_CRM_URL)")
	}
	poolCfg, err := poolConfig(cfg.Database.URL, cfg.Engine.Concurrency)
	if err != nil {
		// pgconn's message shows the DSN with its password redacted.
		return usageError{fmt.Errorf("OUTBOX_DATABASE_URL: %w", err)}
	}
	instances, err := buildInstances(cfg)
	if err != nil {
		return usageError{err}
	}
	if cfg.Log.JSON() {
		// The error serve stops with is a log line like the others, which a JSON log
		// pipeline can read, rather than the plain line run prints.
		defer func() {
			if err != nil {
				logger.ErrorContext(context.WithoutCancel(ctx), "outboxd stopped on an error", "err", err)
				err = loggedError{err}
			}
		}()
	}

	ctx, stop := signal.NotifyContext(ctx, serveStopSignals()...)
	defer stop()

	registry := prometheus.NewRegistry()
	registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)

	// The pool connects lazily: relay.Run pings it first, retrying while the database
	// comes up.
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()

	relayCfg := cfg.Relay()
	relayCfg.Logger = logger
	relayCfg.Registerer = registry
	r, err := relay.New(pool, relayCfg, instances)
	if err != nil {
		return err
	}

	httpLogger := logger.With("component", "http")
	srv := httpserver.New(&httpserver.Config{
		Addr:            cfg.HTTPAddr,
		ReadyFunc:       readiness(r.Ready, httpLogger),
		Gatherer:        registry,
		ShutdownTimeout: cfg.Engine.ShutdownTimeout,
		Logger:          httpLogger,
	})
	if len(cfg.API.Tokens) > 0 {
		// The API's writes reset the pool when they meet a server that takes no writes
		// (a failover): through the relay, whose LISTEN connection must move as well.
		svc := &intent.Service{Pool: pool, Policy: cfg.API.Policy(), ResetFunc: r.ResetPool}
		apiHandler := api.New(svc, &api.Config{
			Rate:    cfg.API.Rate,
			MaxBody: cfg.API.MaxBody,
			Logger:  logger.With("component", "api"),
		})
		srv.Handle("/v1/", apiHandler)
		// The MCP endpoint serves the same tokens, under the same limits.
		srv.Handle("/mcp", apiHandler.Limit(mcpserver.Handler(svc, &mcpserver.Config{Logger: logger, Version: buildVersion()}))) // mcpserver names its component
	}
	// Listen before the relay starts, so a taken port fails before any row is claimed.
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		if ctx.Err() != nil {
			// Stopped before it started (the lookup of a name in the address takes
			// ctx): nothing was claimed, and a stop is no failure.
			return nil
		}
		return fmt.Errorf("listen on OUTBOX_HTTP_ADDR: %w", err)
	}

	gc := e.tuneGC(cfg.Engine.MaxClaimedBytes)
	logger.InfoContext(ctx, "outboxd starting", "version", buildVersion(), "gc", gc, "config", cfg)
	// Either part failing ends the other: a relay that cannot start takes the HTTP
	// server down with it, and a failed listener stops the relay.
	g, gctx := errgroup.WithContext(ctx)
	// The HTTP server stops once the relay has, not with it: while the relay finishes
	// its deliveries in flight and records their outcomes (up to OUTBOX_SHUTDOWN_TIMEOUT
	// and more), /healthz still says the process lives, /readyz that the relay is
	// stopping, and /metrics shows the stop. Shut down together, every probe and scrape
	// was refused for the whole stop, and a liveness probe could take the draining
	// process for a dead one.
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(gctx))
	defer stopHTTP()
	g.Go(func() error {
		defer stopHTTP()
		if err := r.Run(gctx); err != nil {
			return err // it starts "relay: " already
		}
		if gctx.Err() == nil {
			return errors.New("relay: stopped without being asked to")
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		signaled := ctx.Err() != nil // rather than a failure of the relay or the server
		// The signals get their default behaviour back, so a second one kills the process.
		stop()
		if signaled {
			logger.InfoContext(gctx, "stopping: finishing deliveries in flight; a second signal exits at once",
				"shutdown_timeout", cfg.Engine.ShutdownTimeout.String())
		}
		return nil
	})
	g.Go(func() error {
		if err := srv.Serve(httpCtx, ln); err != nil {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	// The error is printed once, by run.
	if err := g.Wait(); err != nil {
		return err
	}
	logger.InfoContext(ctx, "outboxd stopped")
	return nil
}

// serveStopSignals are the signals on which serve stops as it does on SIGTERM: finishing
// the deliveries in flight and recording their outcomes. SIGHUP too (a terminal or an SSH
// session that went away), whose default ended the process at once, every delivery in
// flight left to its lease and retried as an ambiguous attempt; unless it is ignored
// (nohup), which asking for it would undo.
func serveStopSignals() []os.Signal {
	stopSignals := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		stopSignals = append(stopSignals, syscall.SIGHUP)
	}
	return stopSignals
}

// warnUnknown warns about each variable that starts with OUTBOX_ but that nothing reads.
func warnUnknown(ctx context.Context, logger *slog.Logger, names []string) {
	for _, name := range names {
		logger.WarnContext(ctx, "unknown variable ignored: outboxd reads no variable of this name; check its spelling", "variable", name)
	}
}

// readiness is ready for /readyz, whose answer anyone who reaches OUTBOX_HTTP_ADDR reads,
// token or not. When ready's error wraps the database's, such as "database unreachable:
// failed to connect to `user=app database=app`: 10.0.0.5:5432 (db.internal): ...", that
// error is logged at debug level and left out of the answer: pgx names the user, the
// database and each host and address tried, which the intent API keeps in the log too.
// The relay's own words stay.
func readiness(ready func(context.Context) error, logger *slog.Logger) func(context.Context) error {
	return func(ctx context.Context) error {
		err := ready(ctx)
		cause := errors.Unwrap(err)
		if cause == nil {
			return err
		}
		logger.DebugContext(ctx, "not ready: the database's error, left out of /readyz's answer", "err", err)
		reason, ok := strings.CutSuffix(err.Error(), ": "+cause.Error())
		if !ok {
			reason = "the relay is not ready"
		}
		return fmt.Errorf("%s (the database's error is logged at debug level)", reason)
	}
}

// buildInstances makes the relay's connector instances from the configuration. The
// webhook instances share one client, and so one pool of keep-alive connections; the
// payment and slack connectors use their packages' own shared default clients.
func buildInstances(cfg *config.Config) (map[string]relay.Instance, error) {
	client := &http.Client{Transport: webhook.DefaultTransport()}
	instances := make(map[string]relay.Instance, len(cfg.Instances()))
	// config.Load has checked what each New checks; the errors name the variables in
	// case the two ever disagree.
	for _, w := range cfg.Webhooks {
		conn, err := webhook.New(webhook.Config{
			URL:       w.URL,
			Secret:    w.Secret.Reveal(),
			Timeout:   w.Timeout,
			Guarantee: w.Guarantee,
			Client:    client,
		})
		if err != nil {
			return nil, fmt.Errorf("%s (%s*): %w", w.Instance(), w.Prefix(), err)
		}
		instances[w.Instance()] = w.RelayInstance(conn)
	}
	for _, c := range cfg.Payments {
		conn, err := payment.New(payment.Config{
			APIKey:  c.APIKey.Reveal(),
			APIBase: c.APIBase,
			Timeout: c.Timeout,
		})
		if err != nil {
			return nil, fmt.Errorf("%s (%s*): %w", c.Instance(), c.Prefix(), err)
		}
		instances[c.Instance()] = c.RelayInstance(conn)
	}
	for _, c := range cfg.Emails {
		if c.Transport == config.EmailTransportResend {
			conn, err := email.NewResend(email.ResendConfig{
				APIKey:  c.APIKey.Reveal(),
				APIBase: c.APIBase,
				From:    c.From,
				Timeout: c.APITimeout,
			})
			if err != nil {
				return nil, fmt.Errorf("%s (%s*): %w", c.Instance(), c.EmailPrefix(), err)
			}
			instances[c.Instance()] = c.RelayInstance(conn)
			continue
		}
		conn, err := email.New(email.Config{
			Addr:     c.Addr,
			Username: c.Username,
			Password: c.Password.Reveal(),
			From:     c.From,
			Timeout:  c.Timeout,
			TLS:      c.TLS,
		})
		if err != nil {
			return nil, fmt.Errorf("%s (%s*, %s*): %w", c.Instance(), c.SMTPPrefix(), c.EmailPrefix(), err)
		}
		instances[c.Instance()] = c.RelayInstance(conn)
	}
	for _, c := range cfg.Slacks {
		conn, err := slack.New(slack.Config{
			Token:        c.Token.Reveal(),
			APIBase:      c.APIBase,
			Timeout:      c.Timeout,
			HistoryLimit: c.HistoryLimit,
		})
		if err != nil {
			return nil, fmt.Errorf("%s (%s*): %w", c.Instance(), c.Prefix(), err)
		}
		instances[c.Instance()] = c.RelayInstance(conn)
	}
	return instances, nil
}

// poolConfig parses the DSN into a pool configuration. Pool settings stay in the DSN
// (pool_max_conns=...); when it does not set pool_max_conns, the pool is sized for the
// relay's concurrency rather than pgxpool's default of the CPU count: deliveries hold
// no connection while they wait on a receiver, but each outcome is written on one.
func poolConfig(dsn string, concurrency int) (*pgxpool.Config, error) {
	// pgxpool.ParseConfig removes pool_max_conns from what it parsed, so whether the
	// DSN sets it is read from pgconn's parse.
	connCfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if _, set := connCfg.RuntimeParams["pool_max_conns"]; !set {
		cfg.MaxConns = defaultMaxConns(concurrency)
	}
	config.SessionDefaults(cfg)
	return cfg, nil
}

// defaultMaxConns is the pool size poolConfig gives a relay of this concurrency when the
// DSN does not set pool_max_conns.
func defaultMaxConns(concurrency int) int32 {
	return int32(min(max(8, 4+concurrency/16), math.MaxInt32))
}
