package config

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/relay"
)

// Config is the whole configuration of `outboxd serve`. Read it with [Load].
type Config struct {
	Database Database
	// HTTPAddr is where serve listens for /healthz, /readyz, /metrics and the intent API.
	HTTPAddr string `env:"OUTBOX_HTTP_ADDR" envDefault:"127.0.0.1:8080" desc:"host:port of the HTTP server: intent API, /metrics, /healthz, /readyz"`
	Log      Log
	Engine   Engine
	API      API
	// Connectors is OUTBOX_CONNECTORS as given: the extra named instances, such as
	// "webhook:crm". Their settings are in the per-kind fields below.
	Connectors []string `env:"OUTBOX_CONNECTORS" desc:"extra named connector instances, comma-separated kind:name with kind webhook, payment, email or slack (e.g. webhook:crm,payment:eu); each reads the kind's variables with the name inserted (OUTBOX_WEBHOOK_CRM_URL, OUTBOX_PAYMENT_EU_API_KEY)"`
	// Webhooks are the webhook instances: the default one first when OUTBOX_WEBHOOK_URL
	// is set, then the named ones in OUTBOX_CONNECTORS order.
	Webhooks []Webhook `env:"-"`
	// Payments are the payment instances: the default one first when
	// OUTBOX_PAYMENT_API_KEY is set, then the named ones.
	Payments []Payment `env:"-"`
	// Emails are the email instances: the default one first when OUTBOX_SMTP_ADDR or
	// OUTBOX_EMAIL_API_KEY is set, then the named ones.
	Emails []Email `env:"-"`
	// Slacks are the slack instances: the default one first when OUTBOX_SLACK_TOKEN is
	// set, then the named ones.
	Slacks []Slack `env:"-"`
	// Unknown lists the variables in the environment that start with OUTBOX_, in any
	// case, but that nothing reads, sorted: most likely misspelt (OUTBOX_WEBHOOK_SECERT,
	// which would leave requests unsigned without a word). Serve warns about each.
	Unknown []string `env:"-"`
}

// Database is the configuration every command needs.
type Database struct {
	// URL is the PostgreSQL DSN. Pool settings go in it (pool_max_conns=...). It may
	// hold a password: print the Database, or [RedactDSN] of the URL, never the URL.
	URL string `env:"OUTBOX_DATABASE_URL,required,notEmpty" desc:"PostgreSQL DSN, URL or keyword/value form; pool settings such as pool_max_conns go in it (required)"`
}

// Log chooses how outboxd logs.
type Log struct {
	// Format is "text" or "json".
	Format string `env:"OUTBOX_LOG_FORMAT" envDefault:"text" desc:"log format on stderr: text or json"`
	// Level is "debug", "info", "warn" or "error"; see [Log.SlogLevel].
	Level string `env:"OUTBOX_LOG_LEVEL" envDefault:"info" desc:"least severe level logged: debug, info, warn or error"`
}

// Engine is the relay's tuning; [Config.Relay] turns it into a [relay.Config].
type Engine struct {
	// BatchSize is the most rows one claim takes.
	BatchSize int `env:"OUTBOX_BATCH_SIZE" envDefault:"1000" desc:"most rows one claim takes"`
	// Concurrency is the most deliveries in flight at once, over all connectors.
	Concurrency int `env:"OUTBOX_CONCURRENCY" envDefault:"128" desc:"most deliveries in flight at once, over all connector instances (at most 10000)"`
	// MaxClaimedBytes bounds the payload bytes of the rows the relay holds claimed.
	MaxClaimedBytes int64 `env:"OUTBOX_MAX_CLAIMED_BYTES" envDefault:"134217728" desc:"most payload and header bytes (as JSON text) of the rows the relay holds claimed, waiting for a worker or in flight (128 MiB); a claim always takes at least one row"`
	// Lease is how long a claimed row stays with this relay before another may take it.
	Lease time.Duration `env:"OUTBOX_LEASE" envDefault:"30s" desc:"how long a claimed row stays with one relay before another may take it; at least 1s longer than every connector timeout, at most 24h"`
	// PollInterval is how often the relay looks for due rows when no NOTIFY arrives, and
	// reclaims expired leases (at least every 5s whatever it is).
	PollInterval time.Duration `env:"OUTBOX_POLL_INTERVAL" envDefault:"1s" desc:"how often the relay looks for due rows when no NOTIFY arrives (scheduled retries, poolers that drop NOTIFY), and reclaims expired leases (at least every 5s whatever this is); at least 10ms"`
	// MaxAttempts sends a row to dead after this many attempts.
	MaxAttempts int `env:"OUTBOX_MAX_ATTEMPTS" envDefault:"25" desc:"attempts after which a row is dead"`
	// MaxAge sends a row to dead when its next attempt would come later than this
	// after its first attempt.
	MaxAge time.Duration `env:"OUTBOX_MAX_AGE" envDefault:"72h" desc:"a row whose next attempt would come later than this after its first attempt is dead"`
	// BackoffBase is the first retry delay, doubled for each attempt.
	BackoffBase time.Duration `env:"OUTBOX_BACKOFF_BASE" envDefault:"1s" desc:"first retry delay, doubled for each attempt (with jitter)"`
	// BackoffMax caps the retry delay.
	BackoffMax time.Duration `env:"OUTBOX_BACKOFF_MAX" envDefault:"1h" desc:"longest retry delay"`
	// Retention is how long delivered and canceled rows are kept.
	Retention time.Duration `env:"OUTBOX_RETENTION" envDefault:"168h" desc:"how long delivered and canceled rows are kept before they are purged"`
	// ShutdownTimeout is how long in-flight deliveries may finish after a stop signal.
	ShutdownTimeout time.Duration `env:"OUTBOX_SHUTDOWN_TIMEOUT" envDefault:"30s" desc:"how long in-flight deliveries may finish after SIGTERM, SIGINT or SIGHUP before they are cancelled"`
	// RelayID names this relay in leases and the attempts log; "" lets the relay
	// generate one.
	RelayID string `env:"OUTBOX_RELAY_ID" desc:"this relay's name in leases and the attempts log (default: generated from host, pid and a random suffix)"`
}

// Load reads the configuration of `outboxd serve` from environ (as os.Environ returns
// it). When anything is wrong, the error is an [*Error] that lists every problem.
func Load(environ []string) (*Config, error) {
	environment := env.ToMap(environ)
	var p problems
	c := parseEnv[Config](environment, "", &p)
	c.validate(&p)
	named := parseConnectors(c.Connectors, &p)
	c.Webhooks = loadInstances(environment, kindWebhook, named[kindWebhook], &p, loadWebhook)
	c.Payments = loadInstances(environment, kindPayment, named[kindPayment], &p, loadPayment)
	c.Emails = loadInstances(environment, kindEmail, named[kindEmail], &p, loadEmail)
	c.Slacks = loadInstances(environment, kindSlack, named[kindSlack], &p, loadSlack)
	for _, in := range c.instances() {
		checkLease(in.timeoutVar(), in.timeout(), c.Engine.Lease, &p)
	}
	c.Unknown = unknownVariables(environment, named)
	if len(p.errs) > 0 {
		// With the variables nothing reads but those a problem names (see Error.Unknown).
		return nil, &Error{Problems: p.errs, Unknown: slices.DeleteFunc(c.Unknown, func(name string) bool { return !p.ok(name) })}
	}
	return &c, nil
}

// testDatabaseVariable is read by internal/pgtest, for tests, and not by outboxd.
const testDatabaseVariable = "OUTBOX_TEST_DATABASE_URL"

// unknownVariables returns the variables in environment that start with OUTBOX_, in any
// case, but that [Load] does not read with the instances named, sorted.
func unknownVariables(environment map[string]string, named map[string][]string) []string {
	known := map[string]bool{testDatabaseVariable: true}
	for _, v := range variablesOf(reflect.TypeFor[Config](), "") {
		known[v.Name] = true
	}
	for _, k := range kinds {
		for i, s := range k.sections {
			for _, name := range append([]string{""}, named[k.name]...) {
				for _, v := range variablesOf(s.typ, k.instancePrefix(i, name)) {
					known[v.Name] = true
				}
			}
		}
	}
	var out []string
	for key := range environment {
		if strings.HasPrefix(strings.ToUpper(key), "OUTBOX_") && !known[key] {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// LoadDatabase reads [Database] from environ (as os.Environ returns it).
func LoadDatabase(environ []string) (Database, error) {
	var p problems
	db := parseEnv[Database](env.ToMap(environ), "", &p)
	db.validate(&p)
	return db, p.err()
}

// LoadOptionalDatabase is [LoadDatabase] for commands that start a database of their own
// when none is given (demo, bench): given is false when OUTBOX_DATABASE_URL is unset,
// empty or white space, and a value that is set but does not parse is an error, never a
// reason to run somewhere else.
func LoadOptionalDatabase(environ []string) (db Database, given bool, err error) {
	// pgx reads white space as it reads "": connect to the defaults.
	if strings.TrimSpace(env.ToMap(environ)["OUTBOX_DATABASE_URL"]) == "" {
		return Database{}, false, nil
	}
	db, err = LoadDatabase(environ)
	return db, err == nil, err
}

// validate checks that the DSN is more than white space and that pgx can parse it.
func (d *Database) validate(p *problems) {
	if d.URL == "" || !p.ok("OUTBOX_DATABASE_URL") {
		return
	}
	if strings.TrimSpace(d.URL) == "" {
		// pgx would parse it as it parses "": connect to a local server's defaults.
		p.addf("OUTBOX_DATABASE_URL", "OUTBOX_DATABASE_URL is required but holds only white space")
		return
	}
	if _, err := ParseDSN("OUTBOX_DATABASE_URL", d.URL); err != nil {
		p.addf("OUTBOX_DATABASE_URL", "%w", err)
	}
}

// ParseDSN parses dsn (given as name) as pgxpool does, or returns one line that says
// why and quotes the DSN redacted. pgx's own message masks only a password's first word
// when the DSN does not parse, so only its reason is kept.
func ParseDSN(name, dsn string) (*pgxpool.Config, error) {
	if (strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")) &&
		strings.ContainsFunc(dsn, unicode.IsControl) {
		// A newline from a file or a Kubernetes secret: pgx drops it around a
		// keyword/value pair but keeps it in a URL, and serve would fail to connect to
		// a database "app\n" (or with a password that is not the one set).
		return nil, fmt.Errorf("%s (%q) must not contain newlines or other control characters, which pgx would keep in the URL's database name, user or password", name, RedactDSN(dsn))
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err == nil {
		SessionDefaults(cfg)
		return cfg, nil
	}
	reason := err.Error()
	if i := strings.LastIndex(reason, "`: "); i >= 0 {
		reason = reason[i+len("`: "):]
	}
	reason = maskQuotedWord(dsn, reason)
	return nil, fmt.Errorf("%s (%s) is not a PostgreSQL URL or keyword/value string that pgx accepts: %s", name, RedactDSN(dsn), reason)
}

// missingEquals matches pgx's reason when a keyword/value DSN has a word without "="
// after it, and the word it quotes: `missing "=" after "cret" in connection info string`.
var missingEquals = regexp.MustCompile(`missing "=" after ("(?:[^"\\]|\\.)*") in connection info string`)

// maskQuotedWord leaves out of pgx's reason the word it quotes from a keyword/value DSN
// when that word comes after a password keyword: unquoted, a password ends at its first
// space, so its second word ("password=se cret user=app") is the one pgx quotes.
func maskQuotedWord(dsn, reason string) string {
	loc := kvPasswordKey.FindStringIndex(dsn)
	m := missingEquals.FindStringSubmatchIndex(reason)
	if loc == nil || m == nil {
		return reason
	}
	if word, err := strconv.Unquote(reason[m[2]:m[3]]); err == nil && !strings.Contains(dsn[loc[1]:], word) {
		return reason
	}
	return reason[:m[0]] + `a word after password= has no "=" after it, and is not shown, as it may be part of the password; ` +
		`a value with spaces goes in single quotes: password='...'` + reason[m[1]:]
}

// SessionDefaults asks for the session settings outboxd's statements count on in every
// session of cfg's pool, each unless the DSN names it. A setting of the connection's own
// outranks the database's and the role's.
//
//   - DateStyle ISO: in pgx's simple protocol and exec mode (the README's advice behind a
//     transaction pooler) every result is read as text, and pgx reads a timestamp's text
//     only in the ISO style, so on a database set to another (SQL, German, Postgres)
//     every statement that returns a time would fail. Asked for as a startup parameter,
//     which transaction poolers track and pass on.
//   - default_transaction_isolation read committed: the relay's claims and the
//     operator's replays take a snapshot per statement; on a database whose sessions
//     default to REPEATABLE READ or SERIALIZABLE the relay refuses to start. Asked for
//     as a startup parameter only where the sessions' default is another: a transaction
//     pooler such as PgBouncer refuses every startup parameter it does not track, this
//     one among them ("unsupported startup parameter"), and would refuse every
//     connection. The pool's first connection finds out with a session of its own
//     first (see readCommitted), in cfg's BeforeConnect, after the one cfg had.
func SessionDefaults(cfg *pgxpool.Config) {
	set := make(map[string]bool, len(cfg.ConnConfig.RuntimeParams))
	for k := range cfg.ConnConfig.RuntimeParams {
		set[strings.ToLower(k)] = true
	}
	if !set["datestyle"] {
		cfg.ConnConfig.RuntimeParams["datestyle"] = "ISO"
	}
	if set["default_transaction_isolation"] {
		return
	}
	rc, before := &readCommitted{}, cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if before != nil {
			if err := before(ctx, cc); err != nil {
				return err
			}
		}
		return rc.ask(ctx, cc)
	}
}

// readCommitted asks for read committed in the sessions of one pool where their default
// is another, which it finds out once.
type readCommitted struct {
	mu           sync.Mutex
	known, needs bool
}

// ask adds default_transaction_isolation=read committed to cc's startup parameters when
// the sessions' default is another: the first time, it connects with cc to find out
// (and fails as that connection fails, to find out at the next).
func (r *readCommitted) ask(ctx context.Context, cc *pgx.ConnConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.known {
		conn, err := pgx.ConnectConfig(ctx, cc.Copy())
		if err != nil {
			return err
		}
		var level string
		err = conn.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&level)
		_ = conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("look up the sessions' default_transaction_isolation: %w", err)
		}
		r.known, r.needs = true, level != "read committed"
	}
	if r.needs {
		cc.RuntimeParams["default_transaction_isolation"] = "read committed"
	}
	return nil
}

// LoadLog reads [Log] from environ (as os.Environ returns it), for commands that log
// but need no more of the configuration.
func LoadLog(environ []string) (Log, error) {
	var p problems
	l := parseEnv[Log](env.ToMap(environ), "", &p)
	l.validate(&p)
	return l, p.err()
}

// Relay returns the engine settings as a [relay.Config]. The caller sets Logger and
// Registerer.
func (c *Config) Relay() *relay.Config {
	e := c.Engine
	return &relay.Config{
		ID:              e.RelayID,
		BatchSize:       e.BatchSize,
		Concurrency:     e.Concurrency,
		MaxClaimedBytes: e.MaxClaimedBytes,
		Lease:           e.Lease,
		PollInterval:    e.PollInterval,
		MaxAttempts:     e.MaxAttempts,
		MaxAge:          e.MaxAge,
		BackoffBase:     e.BackoffBase,
		BackoffMax:      e.BackoffMax,
		Retention:       e.Retention,
		ShutdownTimeout: e.ShutdownTimeout,
	}
}

// Instances returns the names of the configured connector instances, as the outbox
// table's connector column names them ("webhook", "webhook:crm", "payment"): the
// webhook instances, then payment, email and slack, each in configuration order.
func (c *Config) Instances() []string {
	all := c.instances()
	names := make([]string, len(all))
	for i, in := range all {
		names[i] = in.Instance()
	}
	return names
}

// instances returns every kind's instance settings, in the order of Instances.
func (c *Config) instances() []instanceConfig {
	var out []instanceConfig
	for _, w := range c.Webhooks {
		out = append(out, w)
	}
	for _, pm := range c.Payments {
		out = append(out, pm)
	}
	for _, e := range c.Emails {
		out = append(out, e)
	}
	for _, s := range c.Slacks {
		out = append(out, s)
	}
	return out
}

// LogValue shows the configuration with its secrets redacted.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.Any("database", c.Database),
		slog.String("http_addr", c.HTTPAddr),
		slog.Any("log", c.Log),
		slog.Any("engine", c.Engine),
		slog.Any("api", c.API),
	}
	for _, in := range c.instances() {
		attrs = append(attrs, slog.Any(in.Instance(), in))
	}
	return slog.GroupValue(attrs...)
}

// String shows the configuration with its secrets redacted.
func (c Config) String() string { return c.LogValue().Resolve().String() }

// GoString is String, so that %#v redacts too.
func (c Config) GoString() string { return c.String() }

// LogValue shows the database settings with the DSN's passwords redacted.
func (d Database) LogValue() slog.Value {
	return slog.GroupValue(slog.String("url", RedactDSN(d.URL)))
}

// String shows the DSN with its passwords redacted.
func (d Database) String() string { return RedactDSN(d.URL) }

// GoString is String, so that %#v redacts too.
func (d Database) GoString() string { return d.String() }

// LogValue shows the log settings.
func (l Log) LogValue() slog.Value {
	return slog.GroupValue(slog.String("format", l.Format), slog.String("level", l.Level))
}

// SlogLevel returns Level as a [slog.Level]; an unknown level (which [Load] refuses)
// is info.
func (l Log) SlogLevel() slog.Level {
	if lvl, ok := logLevels[strings.ToLower(l.Level)]; ok {
		return lvl
	}
	return slog.LevelInfo
}

// JSON reports whether the log format is json.
func (l Log) JSON() bool { return strings.EqualFold(l.Format, "json") }

var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// LogValue shows the engine settings. Durations are strings, as in the variables, so
// that a JSON log does not show nanoseconds.
func (e Engine) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("batch_size", e.BatchSize),
		slog.Int("concurrency", e.Concurrency),
		slog.Int64("max_claimed_bytes", e.MaxClaimedBytes),
		slog.String("lease", e.Lease.String()),
		slog.String("poll_interval", e.PollInterval.String()),
		slog.Int("max_attempts", e.MaxAttempts),
		slog.String("max_age", e.MaxAge.String()),
		slog.String("backoff_base", e.BackoffBase.String()),
		slog.String("backoff_max", e.BackoffMax.String()),
		slog.String("retention", e.Retention.String()),
		slog.String("shutdown_timeout", e.ShutdownTimeout.String()),
		slog.String("relay_id", e.RelayID),
	)
}

func (c *Config) validate(p *problems) {
	if _, port, err := net.SplitHostPort(c.HTTPAddr); err != nil || port == "" {
		p.addf("OUTBOX_HTTP_ADDR", "OUTBOX_HTTP_ADDR must be host:port (such as 127.0.0.1:8080 or :8080), got %q", c.HTTPAddr)
	} else if _, err := net.LookupPort("tcp", port); err != nil {
		// The port as the listener reads it: a number up to 65535, or a service name.
		p.addf("OUTBOX_HTTP_ADDR", "OUTBOX_HTTP_ADDR must be host:port with a port from 0 to 65535 (such as 127.0.0.1:8080 or :8080), got %q", c.HTTPAddr)
	}
	c.Database.validate(p)
	c.Log.validate(p)
	c.Engine.validate(p)
	c.API.validate(p)
}

func (l *Log) validate(p *problems) {
	switch strings.ToLower(l.Format) {
	case "text", "json":
	default:
		p.addf("OUTBOX_LOG_FORMAT", "OUTBOX_LOG_FORMAT must be text or json, got %q", l.Format)
	}
	if _, ok := logLevels[strings.ToLower(l.Level)]; !ok {
		p.addf("OUTBOX_LOG_LEVEL", "OUTBOX_LOG_LEVEL must be debug, info, warn or error, got %q", l.Level)
	}
}

// minPollInterval is the least OUTBOX_POLL_INTERVAL. An idle relay claims once per
// interval for each instance: at 1ns it ran about 7,000 claims a second against the
// database with nothing to deliver, and 1ms is still a thousand.
const minPollInterval = 10 * time.Millisecond

// maxLease is the most OUTBOX_LEASE. A row whose relay died comes back only when its
// lease ends: at 2562047h it never did, and the relay's arithmetic on the lease (claim
// time plus lease) could overflow. A connector's timeout must fit inside the lease with
// a second to spare, so this also bounds the timeouts, which none needs near a day.
const maxLease = 24 * time.Hour

// maxConcurrency is the most OUTBOX_CONCURRENCY, the relay's (see relay.MaxConcurrency).
const maxConcurrency = relay.MaxConcurrency

func (e *Engine) validate(p *problems) {
	for _, v := range []struct {
		name  string
		value int64
	}{
		{"OUTBOX_BATCH_SIZE", int64(e.BatchSize)},
		{"OUTBOX_CONCURRENCY", int64(e.Concurrency)},
		{"OUTBOX_MAX_ATTEMPTS", int64(e.MaxAttempts)},
		{"OUTBOX_MAX_CLAIMED_BYTES", e.MaxClaimedBytes},
	} {
		if v.value <= 0 {
			p.addf(v.name, "%s must be positive, got %d", v.name, v.value)
		}
	}
	for _, v := range []struct {
		name  string
		value time.Duration
	}{
		{"OUTBOX_LEASE", e.Lease},
		{"OUTBOX_POLL_INTERVAL", e.PollInterval},
		{"OUTBOX_MAX_AGE", e.MaxAge},
		{"OUTBOX_BACKOFF_BASE", e.BackoffBase},
		{"OUTBOX_BACKOFF_MAX", e.BackoffMax},
		{"OUTBOX_RETENTION", e.Retention},
		{"OUTBOX_SHUTDOWN_TIMEOUT", e.ShutdownTimeout},
	} {
		// Zero is refused too: the relay would read it as "use the default", which
		// is not what someone who wrote 0s meant.
		if v.value <= 0 {
			p.addf(v.name, "%s must be positive, got %s", v.name, v.value)
		}
	}
	if p.ok("OUTBOX_POLL_INTERVAL") && e.PollInterval < minPollInterval {
		p.addf("OUTBOX_POLL_INTERVAL", "OUTBOX_POLL_INTERVAL must be at least %s (a busy relay looks for rows every few "+
			"milliseconds by itself, and NOTIFY wakes an idle one; shorter only has an idle relay query the database "+
			"without pause), got %s", minPollInterval, e.PollInterval)
	}
	if p.ok("OUTBOX_LEASE") && e.Lease > maxLease {
		p.addf("OUTBOX_LEASE", "OUTBOX_LEASE must be at most %s (a dead relay's rows come back only when their lease ends), got %s",
			maxLease, e.Lease)
	}
	if p.ok("OUTBOX_CONCURRENCY") && e.Concurrency > maxConcurrency {
		p.addf("OUTBOX_CONCURRENCY", "OUTBOX_CONCURRENCY must be at most %d, got %d", maxConcurrency, e.Concurrency)
	}
	if p.ok("OUTBOX_BACKOFF_BASE", "OUTBOX_BACKOFF_MAX") && e.BackoffBase > e.BackoffMax {
		p.addf("OUTBOX_BACKOFF_BASE", "OUTBOX_BACKOFF_BASE (%s) must not exceed OUTBOX_BACKOFF_MAX (%s)", e.BackoffBase, e.BackoffMax)
	}
	if !utf8.ValidString(e.RelayID) {
		// The relay refuses it too, as PostgreSQL would in every claim.
		p.addf("OUTBOX_RELAY_ID", "OUTBOX_RELAY_ID must be UTF-8 text, got %q", e.RelayID)
	}
	if strings.TrimSpace(e.RelayID) != e.RelayID {
		p.addf("OUTBOX_RELAY_ID", "OUTBOX_RELAY_ID must not start or end with spaces, got %q", e.RelayID)
	}
	if len(e.RelayID) > relay.MaxIDLength {
		p.addf("OUTBOX_RELAY_ID", "OUTBOX_RELAY_ID must be at most %d bytes, got %d", relay.MaxIDLength, len(e.RelayID))
	}
}
