package config

import (
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/relay"
)

// Payment is one payment (Stripe) connector instance. Its guarantee is always
// enforced: Stripe dedupes on the Idempotency-Key header, so it has no GUARANTEE or
// ON_AMBIGUOUS variable. The default instance reads OUTBOX_PAYMENT_API_KEY and its
// siblings; payment:eu reads OUTBOX_PAYMENT_EU_API_KEY and so on.
type Payment struct {
	// Name is the instance's name: "" for the default instance, "eu" for payment:eu.
	Name string `env:"-"`
	// APIKey is the Stripe secret or restricted key.
	APIKey Secret `env:"API_KEY" desc:"Stripe secret or restricted API key; setting it creates the default payment instance (required for a named instance)"`
	// APIBase is the Stripe API's base URL; another value points at a proxy or a mock.
	APIBase string `env:"API_BASE" envDefault:"https://api.stripe.com" desc:"base URL of the Stripe API, for a proxy or stripe-mock"`
	// Timeout bounds one attempt.
	Timeout time.Duration `env:"TIMEOUT" envDefault:"20s" desc:"time limit of one attempt, at least 1s shorter than OUTBOX_LEASE"`
	// Rate is the most requests per second; 0 means no limit.
	Rate float64 `env:"RATE" envDefault:"0" desc:"most requests per second to this instance, 0 for no limit"`
	// Concurrency is the most deliveries in flight; 0 means the global concurrency.
	Concurrency int `env:"CONCURRENCY" envDefault:"0" desc:"most deliveries in flight to this instance, 0 for OUTBOX_CONCURRENCY"`
}

// Instance returns the instance's name in the outbox table's connector column:
// "payment" or "payment:eu".
func (c Payment) Instance() string { return instanceLabel(kindPayment, c.Name) }

// Prefix returns the instance's variable prefix: OUTBOX_PAYMENT_ or OUTBOX_PAYMENT_EU_.
func (c Payment) Prefix() string { return kindNamed(kindPayment).instancePrefix(0, c.Name) }

func (c Payment) timeout() time.Duration { return c.Timeout }
func (c Payment) timeoutVar() string     { return c.Prefix() + "TIMEOUT" }

// RelayInstance returns the instance's limits for the relay, delivering through conn.
func (c Payment) RelayInstance(conn connectors.Connector) relay.Instance {
	return relay.Instance{Connector: conn, Concurrency: c.Concurrency, Rate: c.Rate}
}

// LogValue shows the instance with its API key redacted.
func (c Payment) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("api_key", c.APIKey),
		slog.String("api_base", connectors.RedactEndpoint(c.APIBase)),
		slog.String("timeout", c.Timeout.String()),
		slog.Float64("rate", c.Rate),
		slog.Int("concurrency", c.Concurrency),
	)
}

// String shows the instance with its API key redacted.
func (c Payment) String() string { return instanceString(c) }

// GoString is String, so that %#v redacts too.
func (c Payment) GoString() string { return c.String() }

func loadPayment(environment map[string]string, k kind, name string, p *problems) Payment {
	c := parseEnv[Payment](environment, k.instancePrefix(0, name), p)
	c.Name = name
	pre := c.Prefix()
	if checkRequired(pre+"API_KEY", c.APIKey.Reveal(), c.Instance(), p) {
		checkToken(pre+"API_KEY", c.APIKey, p)
	}
	checkAPIBase(pre+"API_BASE", c.APIBase, p)
	checkTimeout(pre+"TIMEOUT", c.Timeout, p)
	checkRate(pre+"RATE", c.Rate, p)
	checkConcurrency(pre+"CONCURRENCY", c.Concurrency, p)
	return c
}
