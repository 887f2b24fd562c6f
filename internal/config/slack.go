package config

import (
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/relay"
)

// Slack is one slack (Web API) connector instance. Its guarantee is reconciled: before
// retrying after an ambiguous attempt, the connector looks for the key in the
// channel's recent history. The default instance reads OUTBOX_SLACK_TOKEN and its
// siblings; slack:ops reads OUTBOX_SLACK_OPS_TOKEN and so on.
type Slack struct {
	// Name is the instance's name: "" for the default instance, "ops" for slack:ops.
	Name string `env:"-"`
	// Token is the bot token (xoxb-...).
	Token Secret `env:"TOKEN" desc:"Slack bot token (xoxb-...); setting it creates the default slack instance (required for a named instance)"`
	// APIBase is the Web API's base URL; another value points at a proxy or a mock.
	APIBase string `env:"API_BASE" envDefault:"https://slack.com/api/" desc:"base URL of the Slack Web API, for a proxy or a mock"`
	// Timeout bounds one attempt, history lookup included.
	Timeout time.Duration `env:"TIMEOUT" envDefault:"20s" desc:"time limit of one attempt, at least 1s shorter than OUTBOX_LEASE"`
	// HistoryLimit is how many channel messages one page of the history read for the
	// key before a retry after an ambiguous attempt holds (up to ten pages are read).
	HistoryLimit int `env:"HISTORY_LIMIT" envDefault:"100" desc:"channel messages per page of history read for an earlier attempt's message before a retry (up to 10 pages, back to the row's first attempt), 1 to 999"`
	// Rate is the most requests per second; 0 means no limit.
	Rate float64 `env:"RATE" envDefault:"0" desc:"most requests per second to this instance, 0 for no limit"`
	// Concurrency is the most deliveries in flight; 0 means the global concurrency.
	Concurrency int `env:"CONCURRENCY" envDefault:"0" desc:"most deliveries in flight to this instance, 0 for OUTBOX_CONCURRENCY"`
}

// maxSlackHistory is the most HistoryLimit the slack connector takes.
const maxSlackHistory = 999

// Instance returns the instance's name in the outbox table's connector column:
// "slack" or "slack:ops".
func (c Slack) Instance() string { return instanceLabel(kindSlack, c.Name) }

// Prefix returns the instance's variable prefix: OUTBOX_SLACK_ or OUTBOX_SLACK_OPS_.
func (c Slack) Prefix() string { return kindNamed(kindSlack).instancePrefix(0, c.Name) }

func (c Slack) timeout() time.Duration { return c.Timeout }
func (c Slack) timeoutVar() string     { return c.Prefix() + "TIMEOUT" }

// RelayInstance returns the instance's limits for the relay, delivering through conn.
func (c Slack) RelayInstance(conn connectors.Connector) relay.Instance {
	return relay.Instance{Connector: conn, Concurrency: c.Concurrency, Rate: c.Rate}
}

// LogValue shows the instance with its token redacted.
func (c Slack) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("token", c.Token),
		slog.String("api_base", connectors.RedactEndpoint(c.APIBase)),
		slog.String("timeout", c.Timeout.String()),
		slog.Int("history_limit", c.HistoryLimit),
		slog.Float64("rate", c.Rate),
		slog.Int("concurrency", c.Concurrency),
	)
}

// String shows the instance with its token redacted.
func (c Slack) String() string { return instanceString(c) }

// GoString is String, so that %#v redacts too.
func (c Slack) GoString() string { return c.String() }

func loadSlack(environment map[string]string, k kind, name string, p *problems) Slack {
	c := parseEnv[Slack](environment, k.instancePrefix(0, name), p)
	c.Name = name
	pre := c.Prefix()
	if checkRequired(pre+"TOKEN", c.Token.Reveal(), c.Instance(), p) {
		checkToken(pre+"TOKEN", c.Token, p)
	}
	checkAPIBase(pre+"API_BASE", c.APIBase, p)
	checkTimeout(pre+"TIMEOUT", c.Timeout, p)
	if name := pre + "HISTORY_LIMIT"; c.HistoryLimit < 1 || c.HistoryLimit > maxSlackHistory {
		p.addf(name, "%s must be from 1 to %d, got %d", name, maxSlackHistory, c.HistoryLimit)
	}
	checkRate(pre+"RATE", c.Rate, p)
	checkConcurrency(pre+"CONCURRENCY", c.Concurrency, p)
	return c
}
