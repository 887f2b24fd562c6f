package config

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/relay"
)

// Webhook is one webhook connector instance. The default instance reads
// OUTBOX_WEBHOOK_URL and its siblings; webhook:crm reads OUTBOX_WEBHOOK_CRM_URL and so on.
type Webhook struct {
	// Name is the instance's name: "" for the default instance, "crm" for webhook:crm.
	Name string `env:"-"`
	// URL receives the POSTs. It may carry a token (in the user info, path or query),
	// so the Webhook's String and LogValue show only its scheme and host.
	URL string `env:"URL" desc:"URL the webhook instance POSTs to; setting it creates the default webhook instance (required for a named instance)"`
	// Secret signs the requests (Standard Webhooks): "whsec_" and base64, or several
	// such secrets separated by white space (spaces, tabs, newlines), each of which signs
	// every request, in the order given, so that a secret can be rotated. It is passed
	// to the webhook connector as read, and the connector splits it the same way. Empty,
	// or white space only, means unsigned.
	Secret Secret `env:"SECRET" desc:"Standard Webhooks signing secret, whsec_ followed by base64, or several separated by white space to rotate it (each request is signed with each, in order); empty sends unsigned requests"`
	// Timeout bounds one attempt.
	Timeout time.Duration `env:"TIMEOUT" envDefault:"10s" desc:"time limit of one attempt, at least 1s shorter than OUTBOX_LEASE"`
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
func (w Webhook) Instance() string { return instanceLabel(kindWebhook, w.Name) }

// Prefix returns the instance's variable prefix: OUTBOX_WEBHOOK_ or OUTBOX_WEBHOOK_CRM_.
func (w Webhook) Prefix() string { return kindNamed(kindWebhook).instancePrefix(0, w.Name) }

func (w Webhook) timeout() time.Duration { return w.Timeout }
func (w Webhook) timeoutVar() string     { return w.Prefix() + "TIMEOUT" }

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
		slog.String("url", connectors.RedactEndpoint(w.URL)),
		slog.Any("secret", w.Secret),
		slog.String("timeout", w.Timeout.String()),
		slog.Float64("rate", w.Rate),
		slog.Int("concurrency", w.Concurrency),
		slog.String("guarantee", string(w.Guarantee)),
		slog.String("on_ambiguous", w.OnAmbiguous),
	)
}

// String shows the instance with its secret and URL redacted.
func (w Webhook) String() string { return instanceString(w) }

// GoString is String, so that %#v redacts too.
func (w Webhook) GoString() string { return w.String() }

func loadWebhook(environment map[string]string, k kind, name string, p *problems) Webhook {
	w := parseEnv[Webhook](environment, k.instancePrefix(0, name), p)
	w.Name = name
	w.Guarantee = connectors.Guarantee(normalize(string(w.Guarantee)))
	w.OnAmbiguous = normalize(w.OnAmbiguous)
	if strings.TrimSpace(w.Secret.Reveal()) == "" {
		// White space only means unsigned, as empty does, and then shows as unset.
		w.Secret = ""
	}
	w.validate(p)
	return w
}

func (w *Webhook) validate(p *problems) {
	pre := w.Prefix()
	if urlVar := pre + "URL"; checkRequired(urlVar, w.URL, w.Instance(), p) {
		checkHTTPURL(urlVar, w.URL, p)
	}
	checkWebhookSecrets(pre+"SECRET", w.Secret, p)
	checkTimeout(pre+"TIMEOUT", w.Timeout, p)
	checkRate(pre+"RATE", w.Rate, p)
	checkConcurrency(pre+"CONCURRENCY", w.Concurrency, p)
	if name := pre + "GUARANTEE"; w.Guarantee != connectors.Forwarded && w.Guarantee != connectors.Enforced {
		p.addf(name, "%s must be %s or %s, got %q", name, connectors.Forwarded, connectors.Enforced, w.Guarantee)
	}
	checkOnAmbiguous(pre+"ON_AMBIGUOUS", w.OnAmbiguous, p)
}

// checkWebhookSecrets reports each secret of s (separated by white space, as the
// webhook connector splits them) that is not a Standard Webhooks secret, naming its
// place when there are several, so that each bad one can be found. It never quotes a
// secret.
func checkWebhookSecrets(name string, s Secret, p *problems) {
	secrets := strings.Fields(s.Reveal())
	reported := false
	for i, secret := range secrets {
		if validWebhookSecret(secret) {
			continue
		}
		where := name
		if len(secrets) > 1 {
			where = fmt.Sprintf("%s: secret %d of %d", name, i+1, len(secrets))
		}
		// addf reports one problem per variable; the variable is named once, for the
		// checks that look, and the later secrets get their own lines.
		key := name
		if reported {
			key = ""
		}
		p.addf(key, "%s must be whsec_ followed by base64 (the Standard Webhooks format)", where)
		reported = true
	}
}

// validWebhookSecret reports whether s is a Standard Webhooks secret, as the webhook
// connector reads it: checked here too, so that it is reported with every other problem.
func validWebhookSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, "whsec_")
	key, err := base64.StdEncoding.DecodeString(rest)
	return ok && err == nil && len(key) > 0
}
