package config

import (
	"log/slog"
	"math"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// section is a group of an instance's variables that share a prefix. Most kinds have
// one; email has three (OUTBOX_SMTP_, and two read with OUTBOX_EMAIL_).
type section struct {
	// prefix starts the default instance's variables; a named instance inserts its
	// upper-cased name and an underscore after it.
	prefix string
	// typ is the struct the section is parsed into.
	typ reflect.Type
}

// kind is a connector kind that OUTBOX_CONNECTORS may name.
type kind struct {
	// name is the kind as OUTBOX_CONNECTORS and the outbox table's connector column
	// spell it.
	name string
	// sections are the instance's variables, grouped by prefix.
	sections []section
	// key is the variable, in the first section, whose presence creates the default
	// instance and which a named instance requires.
	key string
	// keyNoun says what key holds, for problems: "a URL".
	keyNoun string
	// altKey, when set, is a variable in section altSection whose presence also creates
	// the default instance (email: OUTBOX_EMAIL_API_KEY, for the Resend transport).
	altKey     string
	altSection int
}

const (
	kindWebhook = "webhook"
	kindPayment = "payment"
	kindEmail   = "email"
	kindSlack   = "slack"
)

// kinds are the connector kinds this version builds. Each has a struct (or, for email,
// three) parsed with the instance's prefix, a field in [Config] and a loader in [Load].
var kinds = []kind{
	{
		name:     kindWebhook,
		sections: []section{{prefix: "OUTBOX_WEBHOOK_", typ: reflect.TypeFor[Webhook]()}},
		key:      "URL", keyNoun: "a URL",
	},
	{
		name:     kindPayment,
		sections: []section{{prefix: "OUTBOX_PAYMENT_", typ: reflect.TypeFor[Payment]()}},
		key:      "API_KEY", keyNoun: "an API key",
	},
	{
		name: kindEmail,
		sections: []section{
			{prefix: "OUTBOX_SMTP_", typ: reflect.TypeFor[SMTP]()},
			{prefix: "OUTBOX_EMAIL_", typ: reflect.TypeFor[EmailSettings]()},
			{prefix: "OUTBOX_EMAIL_", typ: reflect.TypeFor[ResendAPI]()},
		},
		key: "ADDR", keyNoun: "an SMTP server address, or OUTBOX_EMAIL_API_KEY to send through Resend",
		altKey: "API_KEY", altSection: 2,
	},
	{
		name:     kindSlack,
		sections: []section{{prefix: "OUTBOX_SLACK_", typ: reflect.TypeFor[Slack]()}},
		key:      "TOKEN", keyNoun: "a token",
	},
}

func kindNamed(name string) kind {
	i := slices.IndexFunc(kinds, func(k kind) bool { return k.name == name })
	if i < 0 {
		panic("config: unknown connector kind " + name)
	}
	return kinds[i]
}

func knownKind(name string) (kind, bool) {
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

// instancePrefix is the prefix of a section's variables for one instance:
// OUTBOX_WEBHOOK_ for the default webhook instance, OUTBOX_WEBHOOK_CRM_ for webhook:crm.
func (k kind) instancePrefix(section int, name string) string {
	if name == "" {
		return k.sections[section].prefix
	}
	return k.sections[section].prefix + strings.ToUpper(name) + "_"
}

// keyVar is the variable that creates the default instance (name ""), or that a named
// instance requires: OUTBOX_WEBHOOK_URL, OUTBOX_WEBHOOK_CRM_URL.
func (k kind) keyVar(name string) string { return k.instancePrefix(0, name) + k.key }

// createsDefault reports whether environment creates the kind's default instance: its
// key variable, or its alternative key, is set.
func (k kind) createsDefault(environment map[string]string) bool {
	if environment[k.keyVar("")] != "" {
		return true
	}
	return k.altKey != "" && environment[k.instancePrefix(k.altSection, "")+k.altKey] != ""
}

// instanceLabel is an instance's name in the outbox table's connector column:
// "webhook" or "webhook:crm".
func instanceLabel(kindName, name string) string {
	if name == "" {
		return kindName
	}
	return kindName + ":" + name
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
		k, known := knownKind(kindName)
		switch {
		case !found && known:
			p.addf("", "OUTBOX_CONNECTORS: %q must be kind:name, such as %s:crm; the default %s instance needs no entry (set %s)",
				entry, k.name, k.name, k.keyVar(""))
		case !found:
			p.addf("", "OUTBOX_CONNECTORS: %q must be kind:name, such as webhook:crm", entry)
		case !known:
			p.addf("", "OUTBOX_CONNECTORS: %q: connector kind %q is not one of %s",
				entry, kindName, kindNames())
		case !instanceName.MatchString(name):
			p.addf("", "OUTBOX_CONNECTORS: %q: the instance name must be lower-case letters, digits and underscores", entry)
		case !outbox.ValidConnectorName(entry):
			// The outbox table's connector column holds what ValidConnectorName allows;
			// relay.New refuses the rest, later and without naming the variable.
			p.addf("", "OUTBOX_CONNECTORS: %q is longer than the outbox table's connector column allows (100 characters)", entry)
		case seen[entry]:
			p.addf("", "OUTBOX_CONNECTORS: %q is listed twice", entry)
		default:
			seen[entry] = true
			named[kindName] = append(named[kindName], name)
		}
	}
	return named
}

// loadInstances reads a kind's instances: the default one, when its key variable is
// set, then the named ones, each with load.
func loadInstances[T any](environment map[string]string, kindName string, names []string, p *problems,
	load func(environment map[string]string, k kind, name string, p *problems) T,
) []T {
	k := kindNamed(kindName)
	var out []T
	if key := k.keyVar(""); k.createsDefault(environment) {
		out = append(out, load(environment, k, "", p))
	} else {
		for _, s := range k.sections {
			for _, v := range variablesOf(s.typ, s.prefix) {
				if environment[v.Name] != "" {
					p.addf(v.Name, "%s is set but %s is not: the default %s instance needs %s", v.Name, key, k.name, k.keyNoun)
				}
			}
		}
	}
	for _, name := range names {
		out = append(out, load(environment, k, name, p))
	}
	k.checkUnlisted(environment, names, p)
	return out
}

// checkUnlisted reports variables of a kind's named instance whose name is not in
// OUTBOX_CONNECTORS: without the entry they would be silently ignored, and rows for
// that instance would wait in pending.
func (k kind) checkUnlisted(environment map[string]string, names []string, p *problems) {
	keys := make([]string, 0, len(environment))
	for key := range environment {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, s := range k.sections {
		fields := variablesOf(s.typ, "")
		for _, key := range keys {
			rest, ok := strings.CutPrefix(key, s.prefix)
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
}

// checkRequired reports a key variable that a named instance lacks.
func checkRequired(name, value, instance string, p *problems) bool {
	if value == "" {
		p.addf(name, "%s is required for %s, which OUTBOX_CONNECTORS names", name, instance)
		return false
	}
	return true
}

// checkToken refuses an API key or token with white space in it (a stray newline
// from a file, say), which the receiver would refuse on every attempt, or another
// control character, which net/http refuses in the request's header on every attempt.
// It never quotes the value.
func checkToken(name string, s Secret, p *problems) {
	if strings.ContainsAny(s.Reveal(), " \t\r\n") {
		p.addf(name, "%s must not contain spaces or newlines", name)
	} else if !connectors.ValidHeaderValue(s.Reveal()) {
		p.addf(name, "%s must not contain control characters", name)
	}
}

// checkHTTPURL reports a URL that is not absolute http or https with a host name and a
// usable port, as [connectors.ParseHTTPURL] refuses it, showing only its scheme and
// host, as it may hold a token. It returns the URL when there is no problem.
func checkHTTPURL(name, raw string, p *problems) *url.URL {
	u, err := url.Parse(raw)
	switch {
	case strings.TrimSpace(raw) != raw:
		// Before url.Parse's reasons, which would not say it (see connectors.ParseHTTPURL).
		p.addf(name, "%s must not begin or end with white space: it would be sent as part of the URL", name)
	case err != nil:
		p.addf(name, "%s is not a valid URL: %s", name, connectors.ParseReason(raw, err))
	case (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
		p.addf(name, "%s must be an absolute http or https URL, got %q", name, connectors.RedactEndpoint(raw))
	case connectors.PortProblem(u) != "":
		p.addf(name, "%s is not a valid URL: %s", name, connectors.PortProblem(u))
	default:
		return u
	}
	return nil
}

// checkAPIBase reports an API's base URL that its connector refuses: what checkHTTPURL
// does, a query or fragment (request paths are appended to it), and a user name or
// password (the API key or token authenticates, and they would not be sent), as
// [connectors.ParseAPIBase] does.
func checkAPIBase(name, raw string, p *problems) *url.URL {
	u := checkHTTPURL(name, raw, p)
	switch {
	case u == nil:
	case u.RawQuery != "" || u.Fragment != "":
		p.addf(name, "%s must not have a query or fragment, got %q", name, connectors.RedactEndpoint(raw))
		return nil
	case u.User != nil:
		p.addf(name, "%s %s", name, connectors.APIBaseCredentialsProblem)
		return nil
	}
	return u
}

func checkTimeout(name string, d time.Duration, p *problems) {
	if d <= 0 {
		p.addf(name, "%s must be positive, got %s", name, d)
	}
}

func checkRate(name string, r float64, p *problems) {
	if r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		p.addf(name, "%s must be requests per second, 0 for no limit, got %v", name, r)
	}
}

func checkConcurrency(name string, c int, p *problems) {
	if c < 0 {
		p.addf(name, "%s must not be negative (0 means OUTBOX_CONCURRENCY), got %d", name, c)
	}
}

func checkOnAmbiguous(name, v string, p *problems) {
	if v != relay.AmbiguousRetry && v != relay.AmbiguousHold {
		p.addf(name, "%s must be %s or %s, got %q", name, relay.AmbiguousRetry, relay.AmbiguousHold, v)
	}
}

// checkOneOf reports a value that is not one of the allowed words.
func checkOneOf(name, v string, p *problems, allowed ...string) {
	if !slices.Contains(allowed, v) {
		p.addf(name, "%s must be %s or %s, got %q", name, strings.Join(allowed[:len(allowed)-1], ", "), allowed[len(allowed)-1], v)
	}
}

// normalize lower-cases a word-valued setting and trims its spaces.
func normalize(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

// minLeaseSpare is the least part of OUTBOX_LEASE a connector's timeout must leave.
const minLeaseSpare = time.Second

// checkLease refuses a timeout that lets an attempt outlive its lease: another relay
// would claim the row while this one is still sending it.
func checkLease(name string, timeout, lease time.Duration, p *problems) {
	// An attempt starts only while it can still end inside its row's lease; with less
	// than minLeaseSpare to spare, a row claimed ahead could hardly wait for a worker.
	if lease > 0 && p.ok(name, "OUTBOX_LEASE") && timeout > lease-minLeaseSpare {
		p.addf(name, "%s (%s) must be at least %s shorter than OUTBOX_LEASE (%s), or a slow attempt outlives its lease and another relay sends the row again",
			name, timeout, minLeaseSpare, lease)
	}
}

// instanceConfig is what [Config] asks of every kind's instance settings.
type instanceConfig interface {
	slog.LogValuer
	// Instance is the name in the outbox table's connector column.
	Instance() string
	// timeout is the instance's time limit on one attempt, and timeoutVar its variable.
	timeout() time.Duration
	timeoutVar() string
}

// instanceString is an instance's String: its name and its redacted settings.
func instanceString(c instanceConfig) string {
	return c.Instance() + " " + c.LogValue().String()
}
