package config

import (
	"encoding/base64"
	"errors"
	"log/slog"
	"math"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/relay"
)

// kind is a connector kind that OUTBOX_CONNECTORS may name.
type kind struct {
	// name is the kind as OUTBOX_CONNECTORS and the outbox table's connector column
	// spell it.
	name string
	// prefix starts the default instance's variables; a named instance inserts its
	// upper-cased name and an underscore after it.
	prefix string
	// typ is the struct one instance is parsed into.
	typ reflect.Type
}

const kindWebhook = "webhook"

// kinds are the connector kinds this version builds. DESIGN.md also names payment
// (OUTBOX_PAYMENT_*), email (OUTBOX_SMTP_*, OUTBOX_EMAIL_FROM) and slack
// (OUTBOX_SLACK_*); each is added here with a struct parsed like [Webhook], a field in
// [Config] and a loader in [Load].
var kinds = []kind{
	{name: kindWebhook, prefix: "OUTBOX_WEBHOOK_", typ: reflect.TypeFor[Webhook]()},
}

func kindNamed(name string) (kind, bool) {
	i := slices.IndexFunc(kinds, func(k kind) bool { return k.name == name })
	if i < 0 {
		return kind{}, false
	}
	return kinds[i], true
}

func kindNames() string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.name
	}
	return strings.Join(names, ", ")
}

// instancePrefix is the variable prefix of a connector instance: OUTBOX_WEBHOOK_ for
// the default webhook instance, OUTBOX_WEBHOOK_CRM_ for webhook:crm.
func (k kind) instancePrefix(name string) string {
	if name == "" {
		return k.prefix
	}
	return k.prefix + strings.ToUpper(name) + "_"
}

var instanceName = regexp.MustCompile(`^[a-z0-9_]+$`)

// parseConnectors checks the entries of OUTBOX_CONNECTORS and returns the instance
// names each kind is given, in order. Spaces around an entry and empty entries (a
// trailing comma) are ignored.
func parseConnectors(entries []string, p *problems) map[string][]string {
	named := make(map[string][]string)
	seen := make(map[string]bool)
	for _, entry := range entries {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		kindName, name, found := strings.Cut(entry, ":")
		k, known := kindNamed(kindName)
		switch {
		case !found && known:
			p.addf("", "OUTBOX_CONNECTORS: %q must be kind:name, such as %s:crm; the default %s instance needs no entry (set %sURL)",
				entry, k.name, k.name, k.prefix)
		case !found:
			p.addf("", "OUTBOX_CONNECTORS: %q must be kind:name, such as webhook:crm", entry)
		case !known:
			p.addf("", "OUTBOX_CONNECTORS: %q: connector kind %q is not available in this version, which has %s only",
				entry, kindName, kindNames())
		case !instanceName.MatchString(name):
			p.addf("", "OUTBOX_CONNECTORS: %q: the instance name must be lower-case letters, digits and underscores", entry)
		case seen[entry]:
			p.addf("", "OUTBOX_CONNECTORS: %q is listed twice", entry)
		default:
			seen[entry] = true
			named[kindName] = append(named[kindName], name)
		}
	}
	return named
}

// checkUnlisted reports variables of a kind's named instance whose name is not in
// OUTBOX_CONNECTORS: without the entry they would be silently ignored, and rows for
// that instance would wait in pending.
func (k kind) checkUnlisted(environment map[string]string, names []string, p *problems) {
	fields := variablesOf(k.typ, "")
	keys := make([]string, 0, len(environment))
	for key := range environment {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, key := range keys {
		rest, ok := strings.CutPrefix(key, k.prefix)
		if !ok || environment[key] == "" {
			continue
		}
		for _, f := range fields {
			middle, ok := strings.CutSuffix(rest, "_"+f.Name)
			if !ok || middle == "" {
				continue
			}
			name := strings.ToLower(middle)
			if strings.ToUpper(name) == middle && instanceName.MatchString(name) && !slices.Contains(names, name) {
				p.addf(key, "%s is set but %s:%s is not in OUTBOX_CONNECTORS", key, k.name, name)
			}
			break
		}
	}
}

// Webhook is one webhook connector instance. The default instance reads
// OUTBOX_WEBHOOK_URL and its siblings; webhook:crm reads OUTBOX_WEBHOOK_CRM_URL and so on.
type Webhook struct {
	// Name is the instance's name: "" for the default instance, "crm" for webhook:crm.
	Name string `env:"-"`
	// URL receives the POSTs. It may carry a token (in the user info, path or query),
	// so the Webhook's String and LogValue show only its scheme and host.
	URL string `env:"URL" desc:"URL the webhook instance POSTs to; setting it creates the default webhook instance (required for a named instance)"`
	// Secret signs the requests (Standard Webhooks): "whsec_" and base64. Empty means
	// unsigned.
	Secret Secret `env:"SECRET" desc:"Standard Webhooks signing secret, whsec_ followed by base64; empty sends unsigned requests"`
	// Timeout bounds one attempt.
	Timeout time.Duration `env:"TIMEOUT" envDefault:"10s" desc:"time limit of one attempt, shorter than OUTBOX_LEASE"`
	// Rate is the most requests per second; 0 means no limit.
	Rate float64 `env:"RATE" envDefault:"0" desc:"most requests per second to this instance, 0 for no limit"`
	// Concurrency is the most deliveries in flight; 0 means the global concurrency.
	Concurrency int `env:"CONCURRENCY" envDefault:"0" desc:"most deliveries in flight to this instance, 0 for OUTBOX_CONCURRENCY"`
	// Guarantee is what the receiver promises about the idempotency key:
	// [connectors.Forwarded] or [connectors.Enforced].
	Guarantee connectors.Guarantee `env:"GUARANTEE" envDefault:"forwarded" desc:"forwarded, or enforced when the receiver dedupes on the Idempotency-Key header"`
	// OnAmbiguous is [relay.AmbiguousRetry] or [relay.AmbiguousHold]: what a
	// forwarded instance does after an attempt whose effect is unknown.
	OnAmbiguous string `env:"ON_AMBIGUOUS" envDefault:"retry" desc:"after an attempt whose effect is unknown, on a forwarded instance: retry, or hold the row for an operator"`
}

// Instance returns the instance's name in the outbox table's connector column:
// "webhook" or "webhook:crm".
func (w Webhook) Instance() string {
	if w.Name == "" {
		return kindWebhook
	}
	return kindWebhook + ":" + w.Name
}

// Prefix returns the instance's variable prefix: OUTBOX_WEBHOOK_ or OUTBOX_WEBHOOK_CRM_.
func (w Webhook) Prefix() string {
	k, _ := kindNamed(kindWebhook)
	return k.instancePrefix(w.Name)
}

// RelayInstance returns the instance's limits and policy for the relay, delivering
// through c.
func (w Webhook) RelayInstance(c connectors.Connector) relay.Instance {
	return relay.Instance{
		Connector:   c,
		Concurrency: w.Concurrency,
		Rate:        w.Rate,
		OnAmbiguous: w.OnAmbiguous,
	}
}

// LogValue shows the instance with its secret and URL redacted.
func (w Webhook) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("url", redactURL(w.URL)),
		slog.Any("secret", w.Secret),
		slog.String("timeout", w.Timeout.String()),
		slog.Float64("rate", w.Rate),
		slog.Int("concurrency", w.Concurrency),
		slog.String("guarantee", string(w.Guarantee)),
		slog.String("on_ambiguous", w.OnAmbiguous),
	)
}

// String shows the instance with its secret and URL redacted.
func (w Webhook) String() string {
	return w.Instance() + " " + w.LogValue().String()
}

// GoString is String, so that %#v redacts too.
func (w Webhook) GoString() string { return w.String() }

// loadWebhooks reads the default webhook instance, when OUTBOX_WEBHOOK_URL is set,
// and the named ones.
func loadWebhooks(environment map[string]string, names []string, p *problems) []Webhook {
	k, _ := kindNamed(kindWebhook)
	var out []Webhook
	if urlVar := k.prefix + "URL"; environment[urlVar] != "" {
		out = append(out, loadWebhook(environment, k, "", p))
	} else {
		for _, v := range variablesOf(k.typ, k.prefix) {
			if environment[v.Name] != "" {
				p.addf(v.Name, "%s is set but %s is not: the default webhook instance needs a URL", v.Name, urlVar)
			}
		}
	}
	for _, name := range names {
		out = append(out, loadWebhook(environment, k, name, p))
	}
	k.checkUnlisted(environment, names, p)
	return out
}

func loadWebhook(environment map[string]string, k kind, name string, p *problems) Webhook {
	w := parseEnv[Webhook](environment, k.instancePrefix(name), p)
	w.Name = name
	w.Guarantee = connectors.Guarantee(strings.ToLower(strings.TrimSpace(string(w.Guarantee))))
	w.OnAmbiguous = strings.ToLower(strings.TrimSpace(w.OnAmbiguous))
	w.validate(p)
	return w
}

func (w *Webhook) validate(p *problems) {
	pre := w.Prefix()
	urlVar := pre + "URL"
	if w.URL == "" {
		p.addf(urlVar, "%s is required for %s, which OUTBOX_CONNECTORS names", urlVar, w.Instance())
	} else if u, err := url.Parse(w.URL); err != nil {
		// url.Error repeats the URL, which may hold a token: give only the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		p.addf(urlVar, "%s is not a valid URL: %v", urlVar, err)
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.addf(urlVar, "%s must be an absolute http or https URL, got %q", urlVar, redactURL(w.URL))
	}
	if name := pre + "SECRET"; w.Secret != "" && !validWebhookSecret(w.Secret.Reveal()) {
		// Never quote the secret.
		p.addf(name, "%s must be whsec_ followed by base64 (the Standard Webhooks format)", name)
	}
	if name := pre + "TIMEOUT"; w.Timeout <= 0 {
		p.addf(name, "%s must be positive, got %s", name, w.Timeout)
	}
	if name := pre + "RATE"; w.Rate < 0 || math.IsNaN(w.Rate) || math.IsInf(w.Rate, 0) {
		p.addf(name, "%s must be requests per second, 0 for no limit, got %v", name, w.Rate)
	}
	if name := pre + "CONCURRENCY"; w.Concurrency < 0 {
		p.addf(name, "%s must not be negative (0 means OUTBOX_CONCURRENCY), got %d", name, w.Concurrency)
	}
	if name := pre + "GUARANTEE"; w.Guarantee != connectors.Forwarded && w.Guarantee != connectors.Enforced {
		p.addf(name, "%s must be %s or %s, got %q", name, connectors.Forwarded, connectors.Enforced, w.Guarantee)
	}
	if name := pre + "ON_AMBIGUOUS"; w.OnAmbiguous != relay.AmbiguousRetry && w.OnAmbiguous != relay.AmbiguousHold {
		p.addf(name, "%s must be %s or %s, got %q", name, relay.AmbiguousRetry, relay.AmbiguousHold, w.OnAmbiguous)
	}
}

// validWebhookSecret reports whether s is a Standard Webhooks secret, as the webhook
// connector reads it: checked here too, so that it is reported with every other problem.
func validWebhookSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, "whsec_")
	key, err := base64.StdEncoding.DecodeString(rest)
	return ok && err == nil && len(key) > 0
}

// checkLease refuses a timeout that lets an attempt outlive its lease: another relay
// would claim the row while this one is still sending it.
func (w *Webhook) checkLease(lease time.Duration, p *problems) {
	name := w.Prefix() + "TIMEOUT"
	if lease > 0 && p.ok(name, "OUTBOX_LEASE") && w.Timeout >= lease {
		p.addf(name, "%s (%s) must be shorter than OUTBOX_LEASE (%s), or a slow attempt outlives its lease and another relay sends the row again",
			name, w.Timeout, lease)
	}
}

// redactURL shows only the scheme and host of a URL: webhook URLs often carry a token
// in the user info, the path or the query.
func redactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return redacted
	}
	out := u.Scheme + "://" + u.Host
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Opaque != "" {
		out += "/" + redacted
	}
	return out
}
