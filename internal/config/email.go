package config

import (
	"log/slog"
	"net"
	"net/mail"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/relay"
)

// Email is one email connector instance, which sends through an SMTP server or through
// Resend's HTTP API ([Email.Transport]). Over SMTP its guarantee is forwarded: the
// Message-ID is derived from the key, but nothing downstream is known to dedupe on it,
// so OnAmbiguous matters. Over Resend it is enforced: Resend dedupes on the
// Idempotency-Key for 24 hours. Its variables have two prefixes: the server's are
// OUTBOX_SMTP_* ([SMTP]) and the messages' and the API's OUTBOX_EMAIL_*
// ([EmailSettings], [ResendAPI]); email:support reads OUTBOX_SMTP_SUPPORT_ADDR,
// OUTBOX_EMAIL_SUPPORT_FROM, OUTBOX_EMAIL_SUPPORT_API_KEY and so on.
type Email struct {
	// Name is the instance's name: "" for the default instance, "support" for
	// email:support.
	Name string
	SMTP
	EmailSettings
	ResendAPI
}

// SMTP is the server settings of an [Email] instance, read from OUTBOX_SMTP_*.
type SMTP struct {
	// Addr is the server's host:port.
	Addr string `env:"ADDR" desc:"SMTP server host:port; setting it creates the default email instance, sending over SMTP"`
	// Username turns on SMTP AUTH, with Password; empty means no authentication.
	Username string `env:"USERNAME" desc:"SMTP AUTH user name; empty for no authentication"`
	Password Secret `env:"PASSWORD" desc:"SMTP AUTH password, set with the user name"`
	// TLS is "opportunistic" (STARTTLS when offered), "mandatory" (STARTTLS or fail),
	// "none" or "implicit" (TLS from the start, SMTPS).
	TLS string `env:"TLS" envDefault:"opportunistic" desc:"opportunistic (STARTTLS when the server offers it), mandatory (STARTTLS or fail), none, or implicit (TLS from the start: SMTPS, port 465)"`
	// Timeout bounds one attempt.
	Timeout time.Duration `env:"TIMEOUT" envDefault:"20s" desc:"time limit of one attempt, at least 1s shorter than OUTBOX_LEASE"`
}

// EmailSettings is the message settings and limits of an [Email] instance, read from
// OUTBOX_EMAIL_*.
type EmailSettings struct {
	// Transport is [EmailTransportSMTP] or [EmailTransportResend]. When unset, it is smtp
	// if the instance's OUTBOX_SMTP_*ADDR is set and resend if its OUTBOX_EMAIL_*API_KEY
	// is; [Load] fills it in.
	Transport string `env:"TRANSPORT" desc:"smtp or resend; defaults to smtp when the SMTP address is set, resend when the API key is"`
	// From is the sender, an address with or without a display name.
	From string `env:"FROM" desc:"sender address of every message, such as \"Outbox <outbox@example.com>\" (required)"`
	// Rate is the most messages per second; 0 means no limit.
	Rate float64 `env:"RATE" envDefault:"0" desc:"most messages per second through this instance, 0 for no limit"`
	// Concurrency is the most deliveries in flight; 0 means the global concurrency.
	Concurrency int `env:"CONCURRENCY" envDefault:"0" desc:"most deliveries in flight to this instance, 0 for OUTBOX_CONCURRENCY"`
	// OnAmbiguous is [relay.AmbiguousRetry] or [relay.AmbiguousHold].
	OnAmbiguous string `env:"ON_AMBIGUOUS" envDefault:"retry" desc:"after an attempt whose effect is unknown (a message may have been sent): retry, or hold the row for an operator"`
}

// ResendAPI is the Resend settings of an [Email] instance whose transport is resend,
// read from OUTBOX_EMAIL_*.
type ResendAPI struct {
	// APIKey is the Resend API key.
	APIKey Secret `env:"API_KEY" desc:"Resend API key; setting it creates the default email instance, sending through Resend"`
	// APIBase is the Resend API's base URL; another value points at a proxy or a fake.
	APIBase string `env:"API_BASE" envDefault:"https://api.resend.com" desc:"base URL of the Resend API, for a proxy or a fake"`
	// APITimeout bounds one attempt through Resend.
	APITimeout time.Duration `env:"API_TIMEOUT" envDefault:"20s" desc:"time limit of one attempt through Resend, at least 1s shorter than OUTBOX_LEASE"`
}

// TLS modes of [SMTP.TLS].
const (
	SMTPTLSOpportunistic = "opportunistic"
	SMTPTLSMandatory     = "mandatory"
	SMTPTLSNone          = "none"
	SMTPTLSImplicit      = "implicit"
)

// Transports of [EmailSettings.Transport].
const (
	EmailTransportSMTP   = "smtp"
	EmailTransportResend = "resend"
)

// Instance returns the instance's name in the outbox table's connector column:
// "email" or "email:support".
func (c Email) Instance() string { return instanceLabel(kindEmail, c.Name) }

// SMTPPrefix returns the prefix of the server variables: OUTBOX_SMTP_ or
// OUTBOX_SMTP_SUPPORT_.
func (c Email) SMTPPrefix() string { return kindNamed(kindEmail).instancePrefix(0, c.Name) }

// EmailPrefix returns the prefix of the message and Resend variables: OUTBOX_EMAIL_ or
// OUTBOX_EMAIL_SUPPORT_.
func (c Email) EmailPrefix() string { return kindNamed(kindEmail).instancePrefix(1, c.Name) }

func (c Email) timeout() time.Duration {
	if c.Transport == EmailTransportResend {
		return c.APITimeout
	}
	return c.Timeout
}

func (c Email) timeoutVar() string {
	if c.Transport == EmailTransportResend {
		return c.EmailPrefix() + "API_TIMEOUT"
	}
	return c.SMTPPrefix() + "TIMEOUT"
}

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

// LogValue shows the instance with its password and API key redacted, and only the
// settings of its transport.
func (c Email) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("transport", c.Transport)}
	if c.Transport == EmailTransportResend {
		attrs = append(attrs,
			slog.Any("api_key", c.APIKey),
			slog.String("api_base", connectors.RedactEndpoint(c.APIBase)),
			slog.String("timeout", c.APITimeout.String()),
		)
	} else {
		attrs = append(attrs,
			slog.String("addr", c.Addr),
			slog.String("username", c.Username),
			slog.Any("password", c.Password),
			slog.String("tls", c.TLS),
			slog.String("timeout", c.Timeout.String()),
		)
	}
	attrs = append(attrs,
		slog.String("from", c.From),
		slog.Float64("rate", c.Rate),
		slog.Int("concurrency", c.Concurrency),
		slog.String("on_ambiguous", c.OnAmbiguous),
	)
	return slog.GroupValue(attrs...)
}

// String shows the instance with its password and API key redacted.
func (c Email) String() string { return instanceString(c) }

// GoString is String, so that %#v redacts too.
func (c Email) GoString() string { return c.String() }

// String shows the Resend settings with the API key redacted.
func (r ResendAPI) String() string {
	return "{api_key:" + r.APIKey.String() + " api_base:" + connectors.RedactEndpoint(r.APIBase) + " api_timeout:" + r.APITimeout.String() + "}"
}

// GoString is String, so that %#v redacts too.
func (r ResendAPI) GoString() string { return r.String() }

func loadEmail(environment map[string]string, k kind, name string, p *problems) Email {
	c := Email{
		Name:          name,
		SMTP:          parseEnv[SMTP](environment, k.instancePrefix(0, name), p),
		EmailSettings: parseEnv[EmailSettings](environment, k.instancePrefix(1, name), p),
		ResendAPI:     parseEnv[ResendAPI](environment, k.instancePrefix(2, name), p),
	}
	c.TLS = normalize(c.TLS)
	c.OnAmbiguous = normalize(c.OnAmbiguous)
	c.Transport = normalize(c.Transport)

	smtp, email := c.SMTPPrefix(), c.EmailPrefix()
	addrVar, keyVar, transportVar := smtp+"ADDR", email+"API_KEY", email+"TRANSPORT"
	switch c.Transport {
	case "":
		switch {
		case c.Addr != "" && c.APIKey != "":
			p.addf(transportVar, "%s and %s are both set: set %s to %s or %s",
				addrVar, keyVar, transportVar, EmailTransportSMTP, EmailTransportResend)
		case c.APIKey != "":
			c.Transport = EmailTransportResend
		case c.Addr != "":
			c.Transport = EmailTransportSMTP
		default: // only a named instance gets here: the default one exists because one is set
			p.addf(addrVar, "%s is required for %s, which OUTBOX_CONNECTORS names (or %s, to send through Resend)",
				addrVar, c.Instance(), keyVar)
		}
	case EmailTransportSMTP, EmailTransportResend:
	default:
		checkOneOf(transportVar, c.Transport, p, EmailTransportSMTP, EmailTransportResend)
	}

	switch c.Transport {
	case EmailTransportSMTP:
		if checkTransportKey(addrVar, c.Addr, c.Instance(), c.Transport, p) {
			host, port, err := net.SplitHostPort(c.Addr)
			// No host name has an "@": what comes before it is a user name or password,
			// which the start-up line would print with the address.
			if n, perr := strconv.Atoi(port); err != nil || host == "" || strings.Contains(host, "@") || perr != nil || n < 1 || n > 65535 {
				if at := strings.LastIndexByte(c.Addr, '@'); at >= 0 {
					// A URL with credentials (smtp://user:pass@host:587), as other tools
					// take it: never quote what lies before the host.
					p.addf(addrVar, "%s must be host:port, such as smtp.example.com:587, without a user name or password (set %s and %s), got %q",
						addrVar, smtp+"USERNAME", smtp+"PASSWORD", redacted+c.Addr[at:])
				} else {
					p.addf(addrVar, "%s must be host:port, such as smtp.example.com:587, got %q", addrVar, c.Addr)
				}
			} else if !connectors.DialableHost(host) {
				// A space from an env file, say: serve would start, and every attempt fail
				// to look the host up until its row was dead.
				p.addf(addrVar, "%s must be host:port, such as smtp.example.com:587, and %q is not a host name or IP address", addrVar, host)
			}
		}
		// A user name without a password is allowed (some servers take an empty one); a
		// password without a user name would be silently unused.
		if user, pass := smtp+"USERNAME", smtp+"PASSWORD"; c.Username == "" && c.Password != "" {
			p.addf(user, "%s is set but %s is not: SMTP authentication needs a user name", pass, user)
		}
		// A newline from a file or a Kubernetes secret would go to the server with AUTH,
		// refused for every message, and the user name would break the start-up line.
		// Spaces may belong to a password; control characters never do.
		for _, v := range []struct{ name, value string }{{smtp + "USERNAME", c.Username}, {smtp + "PASSWORD", c.Password.Reveal()}} {
			if strings.ContainsFunc(v.value, unicode.IsControl) {
				p.addf(v.name, "%s must not contain newlines or other control characters", v.name)
			}
		}
		checkOneOf(smtp+"TLS", c.TLS, p, SMTPTLSOpportunistic, SMTPTLSMandatory, SMTPTLSNone, SMTPTLSImplicit)
		checkTimeout(smtp+"TIMEOUT", c.Timeout, p)
		checkUnused(environment, reflect.TypeFor[ResendAPI](), email, c.Instance(), c.Transport, p)
	case EmailTransportResend:
		if checkTransportKey(keyVar, c.APIKey.Reveal(), c.Instance(), c.Transport, p) {
			checkToken(keyVar, c.APIKey, p)
		}
		checkAPIBase(email+"API_BASE", c.APIBase, p)
		checkTimeout(email+"API_TIMEOUT", c.APITimeout, p)
		checkUnused(environment, reflect.TypeFor[SMTP](), smtp, c.Instance(), c.Transport, p)
	}
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

// checkUnused reports the variables of the other transport's struct t (read with
// prefix) that are set to something other than their default: the instance's
// transport would silently ignore them.
func checkUnused(environment map[string]string, t reflect.Type, prefix, instance, transport string, p *problems) {
	for _, v := range variablesOf(t, prefix) {
		if value := environment[v.Name]; value != "" && value != v.Default {
			p.addf(v.Name, "%s is set but %s sends through %s, which does not use it", v.Name, instance, transport)
		}
	}
}

// checkTransportKey reports the variable an instance's transport needs when it is not
// set. It never quotes the value.
func checkTransportKey(name, value, instance, transport string, p *problems) bool {
	if value == "" {
		p.addf(name, "%s is required for %s, which sends through %s", name, instance, transport)
		return false
	}
	return true
}
