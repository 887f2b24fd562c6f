package config

import (
	"log/slog"
	"net"
	"net/mail"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/relay"
)

// Email is one email (SMTP) connector instance. Its guarantee is forwarded: the
// Message-ID is derived from the key, but nothing downstream is known to dedupe on it,
// so OnAmbiguous matters. Its variables have two prefixes: the server's are
// OUTBOX_SMTP_* ([SMTP]) and the messages' OUTBOX_EMAIL_* ([EmailSettings]); email:support
// reads OUTBOX_SMTP_SUPPORT_ADDR, OUTBOX_EMAIL_SUPPORT_FROM and so on.
type Email struct {
	// Name is the instance's name: "" for the default instance, "support" for
	// email:support.
	Name string
	SMTP
	EmailSettings
}

// SMTP is the server settings of an [Email] instance, read from OUTBOX_SMTP_*.
type SMTP struct {
	// Addr is the server's host:port.
	Addr string `env:"ADDR" desc:"SMTP server host:port; setting it creates the default email instance (required for a named instance)"`
	// Username turns on SMTP AUTH, with Password; empty means no authentication.
	Username string `env:"USERNAME" desc:"SMTP AUTH user name; empty for no authentication"`
	Password Secret `env:"PASSWORD" desc:"SMTP AUTH password, set with the user name"`
	// TLS is "opportunistic" (STARTTLS when offered), "mandatory" (STARTTLS or fail) or
	// "none".
	TLS string `env:"TLS" envDefault:"opportunistic" desc:"opportunistic (STARTTLS when the server offers it), mandatory (STARTTLS or fail) or none"`
	// Timeout bounds one attempt.
	Timeout time.Duration `env:"TIMEOUT" envDefault:"20s" desc:"time limit of one attempt, shorter than OUTBOX_LEASE"`
}

// EmailSettings is the message settings and limits of an [Email] instance, read from
// OUTBOX_EMAIL_*.
type EmailSettings struct {
	// From is the sender, an address with or without a display name.
	From string `env:"FROM" desc:"sender address of every message, such as \"Outbox <outbox@example.com>\" (required)"`
	// Rate is the most messages per second; 0 means no limit.
	Rate float64 `env:"RATE" envDefault:"0" desc:"most messages per second through this instance, 0 for no limit"`
	// Concurrency is the most deliveries in flight; 0 means the global concurrency.
	Concurrency int `env:"CONCURRENCY" envDefault:"0" desc:"most deliveries in flight to this instance, 0 for OUTBOX_CONCURRENCY"`
	// OnAmbiguous is [relay.AmbiguousRetry] or [relay.AmbiguousHold].
	OnAmbiguous string `env:"ON_AMBIGUOUS" envDefault:"retry" desc:"after an attempt whose effect is unknown (a message may have been sent): retry, or hold the row for an operator"`
}

// TLS modes of [SMTP.TLS].
const (
	SMTPTLSOpportunistic = "opportunistic"
	SMTPTLSMandatory     = "mandatory"
	SMTPTLSNone          = "none"
)

// Instance returns the instance's name in the outbox table's connector column:
// "email" or "email:support".
func (c Email) Instance() string { return instanceLabel(kindEmail, c.Name) }

// SMTPPrefix returns the prefix of the server variables: OUTBOX_SMTP_ or
// OUTBOX_SMTP_SUPPORT_.
func (c Email) SMTPPrefix() string { return kindNamed(kindEmail).instancePrefix(0, c.Name) }

// EmailPrefix returns the prefix of the message variables: OUTBOX_EMAIL_ or
// OUTBOX_EMAIL_SUPPORT_.
func (c Email) EmailPrefix() string { return kindNamed(kindEmail).instancePrefix(1, c.Name) }

func (c Email) timeout() time.Duration { return c.Timeout }
func (c Email) timeoutVar() string     { return c.SMTPPrefix() + "TIMEOUT" }

// RelayInstance returns the instance's limits and policy for the relay, delivering
// through conn.
func (c Email) RelayInstance(conn connectors.Connector) relay.Instance {
	return relay.Instance{
		Connector:   conn,
		Concurrency: c.Concurrency,
		Rate:        c.Rate,
		OnAmbiguous: c.OnAmbiguous,
	}
}

// LogValue shows the instance with its password redacted.
func (c Email) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("addr", c.Addr),
		slog.String("username", c.Username),
		slog.Any("password", c.Password),
		slog.String("tls", c.TLS),
		slog.String("timeout", c.Timeout.String()),
		slog.String("from", c.From),
		slog.Float64("rate", c.Rate),
		slog.Int("concurrency", c.Concurrency),
		slog.String("on_ambiguous", c.OnAmbiguous),
	)
}

// String shows the instance with its password redacted.
func (c Email) String() string { return instanceString(c) }

// GoString is String, so that %#v redacts too.
func (c Email) GoString() string { return c.String() }

func loadEmail(environment map[string]string, k kind, name string, p *problems) Email {
	c := Email{
		Name:          name,
		SMTP:          parseEnv[SMTP](environment, k.instancePrefix(0, name), p),
		EmailSettings: parseEnv[EmailSettings](environment, k.instancePrefix(1, name), p),
	}
	c.TLS = normalize(c.TLS)
	c.OnAmbiguous = normalize(c.OnAmbiguous)

	smtp, email := c.SMTPPrefix(), c.EmailPrefix()
	if addr := smtp + "ADDR"; checkRequired(addr, c.Addr, c.Instance(), p) {
		host, port, err := net.SplitHostPort(c.Addr)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			p.addf(addr, "%s must be host:port, such as smtp.example.com:587, got %q", addr, c.Addr)
		}
	}
	// A user name without a password is allowed (some servers take an empty one); a
	// password without a user name would be silently unused.
	if user, pass := smtp+"USERNAME", smtp+"PASSWORD"; c.Username == "" && c.Password != "" {
		p.addf(user, "%s is set but %s is not: SMTP authentication needs a user name", pass, user)
	}
	checkOneOf(smtp+"TLS", c.TLS, p, SMTPTLSOpportunistic, SMTPTLSMandatory, SMTPTLSNone)
	checkTimeout(smtp+"TIMEOUT", c.Timeout, p)
	if from := email + "FROM"; c.From == "" {
		p.addf(from, "%s is required for %s: it is the sender of every message", from, c.Instance())
	} else if _, err := mail.ParseAddress(c.From); err != nil {
		p.addf(from, "%s must be an email address such as outbox@example.com or \"Outbox <outbox@example.com>\", got %q", from, c.From)
	}
	checkRate(email+"RATE", c.Rate, p)
	checkConcurrency(email+"CONCURRENCY", c.Concurrency, p)
	checkOnAmbiguous(email+"ON_AMBIGUOUS", c.OnAmbiguous, p)
	return c
}
