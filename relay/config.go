package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/connectors"
)

// Config tunes a [Relay]. A zero field means its default.
type Config struct {
	// ID names this relay in leases and the attempts log: UTF-8 text without NUL, which
	// PostgreSQL can store, of at most [MaxIDLength] bytes. Defaults to host-pid-random.
	ID string
	// BatchSize is the most rows one claim takes. Defaults to 1000.
	BatchSize int
	// Concurrency is the most deliveries in flight at once, over all connectors, at most
	// [MaxConcurrency]. Defaults to 128.
	Concurrency int
	// MaxClaimedBytes bounds the payload and header bytes of the rows this relay holds claimed,
	// waiting for a worker or in flight, so that large payloads cannot exhaust its memory:
	// a claim stops when its rows' payloads and headers (values stored compressed or over
	// 1 kB at their JSON text, as the relay holds them) reach what is left. While less than a quarter is left, only connector
	// instances that hold no rows claim, so one instance's large payloads never stop the
	// others. A claim always takes at least one row, so a payload larger than the bound
	// is still delivered. The bound may thus be passed by one row per instance. Defaults
	// to 128 MiB.
	MaxClaimedBytes int64
	// Lease is how long a claimed row stays with this relay before another may take it.
	// Defaults to 30s, or to a second more than the longest time limit of the
	// instances' connectors when that is longer (the payment, email and slack connectors
	// default to 30s). Give every connector a time limit (connectors.Timeout) at least
	// a second shorter: a row then starts only while its attempt can still end inside
	// its lease. An attempt with no limit, or a longer one, can outlive the lease, and
	// another relay may then send the row again meanwhile (outboxd serve refuses such a
	// configuration).
	Lease time.Duration
	// PollInterval is how often the relay looks for due rows when no NOTIFY arrives
	// (scheduled retries, or NOTIFY blocked by a pooler), and puts back rows whose lease
	// expired (their relay died), which it does at least every 5s whatever this is.
	// Defaults to 1s.
	PollInterval time.Duration
	// MaxAttempts sends a row to dead after this many attempts, at most math.MaxInt32
	// (the attempts column is an integer). Defaults to 25.
	MaxAttempts int
	// MaxAge sends a row to dead when its next attempt would come later than this after
	// its first attempt: it bounds how long a row is retried, however long it waited
	// before (scheduled with not_before, awaiting approval). Defaults to 72h.
	MaxAge time.Duration
	// BackoffBase is the first retry delay, doubled for each attempt. Defaults to 1s.
	BackoffBase time.Duration
	// BackoffMax caps the retry delay. Defaults to 1h.
	BackoffMax time.Duration
	// Retention is how long delivered and canceled rows are kept: Run deletes those of
	// its connector instances past it soon after it starts, and then every minute.
	// Defaults to 168h.
	Retention time.Duration
	// ShutdownTimeout is how long in-flight deliveries may finish once Run's context is
	// done, before they are cancelled; their outcomes then get as long again, and at
	// least 5s, to be recorded. Defaults to 30s.
	ShutdownTimeout time.Duration
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's Prometheus metrics. Defaults to a private registry.
	// Relays that may run at the same time cannot share one (New refuses the second):
	// give each its own, or wrap it for each with prometheus.WrapRegistererWith and a
	// label that tells them apart. A relay's series stay registered once its Run has
	// returned, so their last values can still be gathered, until a relay made with New
	// on the same Registerer takes their place.
	Registerer prometheus.Registerer
	// NowFunc is the clock. Defaults to time.Now, corrected for the database clock's
	// offset; tests inject their own.
	NowFunc func() time.Time

	usesRealClock bool
}

// Instance is one configured connector instance and its limits.
type Instance struct {
	// Connector delivers the rows. Its Guarantee must be [connectors.Enforced],
	// [connectors.Reconciled] or [connectors.Forwarded].
	Connector connectors.Connector
	// Concurrency is the most deliveries in flight to this instance. Defaults to, and is
	// at most, the slots it can take: Config.Concurrency, less the one each other
	// instance keeps when there are slots to keep (see the package doc).
	Concurrency int
	// Rate is the most requests per second this relay sends to the instance (relays
	// sharing it do not coordinate); 0 means no limit. Requests
	// are paced: no more than a tenth of a second's worth (at least one) go at once, and
	// never more than the rate (rounded up) within one second.
	Rate float64
	// OnAmbiguous is what a forwarded connector does after an attempt whose effect is
	// unknown: "retry" (the default) or "hold" the row for an operator.
	OnAmbiguous string
	// MaxAge overrides Config.MaxAge for this instance. Defaults to Config.MaxAge, but
	// never longer than the connector's key window (see [connectors.KeyWindower]), so
	// rows give up before the receiver forgets their key.
	MaxAge time.Duration
}

// defaultLease is [Config.Lease]'s default, and defaultLeaseSpare what a default lease
// leaves beyond the longest time limit of a relay's connectors.
const (
	defaultLease      = 30 * time.Second
	defaultLeaseSpare = time.Second
)

// MaxIDLength is the most bytes of [Config.ID].
const MaxIDLength = 255

// MaxConcurrency is the most [Config.Concurrency]: New allocates each connector instance a
// queue with a place (0.25 kB) for each of its workers and each row it may claim ahead, up
// to twenty rounds of deliveries and at most twenty claims of Config.BatchSize rows (7 MB
// per instance at this bound with the default BatchSize), and the relay a place (0.17 kB)
// for the outcome of each row it may hold; far more made the process die out of memory
// before it said a word, or New panic.
const MaxConcurrency = 10000

// DefaultMaxClaimedBytes is [Config.MaxClaimedBytes]'s default: 128 MiB.
const DefaultMaxClaimedBytes = 128 << 20

// Policies for [Instance.OnAmbiguous].
const (
	AmbiguousRetry = "retry"
	AmbiguousHold  = "hold"
)

func (c *Config) withDefaults() *Config {
	host, _ := os.Hostname()
	out := *c
	out.ID = cmp.Or(c.ID, fmt.Sprintf("%s-%d-%s", cmp.Or(host, "relay"), os.Getpid(), randomSuffix()))
	out.BatchSize = cmp.Or(c.BatchSize, 1000)
	out.Concurrency = cmp.Or(c.Concurrency, 128)
	out.MaxClaimedBytes = cmp.Or(c.MaxClaimedBytes, DefaultMaxClaimedBytes)
	out.Lease = cmp.Or(c.Lease, defaultLease)
	out.PollInterval = cmp.Or(c.PollInterval, time.Second)
	out.MaxAttempts = cmp.Or(c.MaxAttempts, 25)
	out.MaxAge = cmp.Or(c.MaxAge, 72*time.Hour)
	out.BackoffBase = cmp.Or(c.BackoffBase, time.Second)
	out.BackoffMax = cmp.Or(c.BackoffMax, time.Hour)
	out.Retention = cmp.Or(c.Retention, 168*time.Hour)
	out.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 30*time.Second)
	out.Logger = cmp.Or(c.Logger, slog.Default())
	if out.Registerer == nil {
		out.Registerer = prometheus.NewRegistry()
	}
	if out.NowFunc == nil {
		out.NowFunc = time.Now
		out.usesRealClock = true
	}
	return &out
}

func (c *Config) validate() error {
	var errs []error
	if !utf8.ValidString(c.ID) || strings.IndexByte(c.ID, 0) >= 0 {
		// PostgreSQL refuses it in every claim: the relay would run and deliver nothing.
		errs = append(errs, fmt.Errorf("ID must be UTF-8 text without NUL, got %q", c.ID))
	}
	if len(c.ID) > MaxIDLength {
		// It is part of a primary key (outbox_wake_connectors), whose entries PostgreSQL
		// bounds, and of the NOTIFY self-test's payload (under 8000 bytes).
		errs = append(errs, fmt.Errorf("ID must be at most %d bytes, got %d", MaxIDLength, len(c.ID)))
	}
	positive := func(name string, v int64) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %d", name, v))
		}
	}
	positive("BatchSize", int64(c.BatchSize))
	positive("Concurrency", int64(c.Concurrency))
	positive("MaxAttempts", int64(c.MaxAttempts))
	positive("MaxClaimedBytes", c.MaxClaimedBytes)
	if c.MaxAttempts > math.MaxInt32 {
		// Compared with the attempts column in SQL, it would fail every reclaim.
		errs = append(errs, fmt.Errorf("MaxAttempts must be at most %d, got %d", math.MaxInt32, c.MaxAttempts))
	}
	if c.Concurrency > MaxConcurrency {
		errs = append(errs, fmt.Errorf("Concurrency must be at most %d, got %d", MaxConcurrency, c.Concurrency))
	}
	for name, d := range map[string]time.Duration{
		"Lease": c.Lease, "PollInterval": c.PollInterval, "MaxAge": c.MaxAge, "BackoffBase": c.BackoffBase,
		"BackoffMax": c.BackoffMax, "Retention": c.Retention, "ShutdownTimeout": c.ShutdownTimeout,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", name, d))
		}
	}
	// Each against the other's default when only one is set: above the cap, the base
	// (jittered) would always be capped, and every retry would come at exactly BackoffMax.
	backoffBase, backoffMax := cmp.Or(c.BackoffBase, time.Second), cmp.Or(c.BackoffMax, time.Hour)
	if c.BackoffBase >= 0 && c.BackoffMax >= 0 && backoffBase > backoffMax {
		errs = append(errs, fmt.Errorf("BackoffBase (%s) must not exceed BackoffMax (%s)", backoffBase, backoffMax))
	}
	return errors.Join(errs...)
}
