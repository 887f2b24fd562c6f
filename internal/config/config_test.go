package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/relay"
)

// environ turns a map into the os.Environ form that Load takes.
func environ(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return out
}

// with returns base plus extra, extra winning.
func with(base map[string]string, extra map[string]string) map[string]string {
	out := maps.Clone(base)
	maps.Copy(out, extra)
	return out
}

var minimal = map[string]string{
	"OUTBOX_DATABASE_URL": "postgres://app@localhost/app",
	"OUTBOX_WEBHOOK_URL":  "https://example.com/hook",
}

// problemLines returns the problems of a Load error as strings.
func problemLines(t *testing.T, err error) []string {
	t.Helper()
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	lines := make([]string, len(cerr.Problems))
	for i, p := range cerr.Problems {
		lines[i] = p.Error()
	}
	return lines
}

func TestLoadDefaults(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(minimal))
	require.NoError(t, err)

	require.Equal(t, "postgres://app@localhost/app", cfg.Database.URL)
	require.Equal(t, "127.0.0.1:8080", cfg.HTTPAddr)
	require.Equal(t, Log{Format: "text", Level: "info"}, cfg.Log)
	require.Equal(t, Engine{
		BatchSize:       1000,
		Concurrency:     128,
		MaxClaimedBytes: 128 << 20,
		Lease:           30 * time.Second,
		PollInterval:    time.Second,
		MaxAttempts:     25,
		MaxAge:          72 * time.Hour,
		BackoffBase:     time.Second,
		BackoffMax:      time.Hour,
		Retention:       168 * time.Hour,
		ShutdownTimeout: 30 * time.Second,
	}, cfg.Engine)
	require.Empty(t, cfg.Connectors)
	require.Equal(t, []Webhook{{
		URL:         "https://example.com/hook",
		Timeout:     10 * time.Second,
		Guarantee:   connectors.Forwarded,
		OnAmbiguous: relay.AmbiguousRetry,
	}}, cfg.Webhooks)
	require.Equal(t, []string{"webhook"}, cfg.Instances())
}

func TestLoadDocumentedDefaults(t *testing.T) {
	t.Parallel()

	// Setting every variable to its documented default changes nothing: the
	// defaults in Variables (and so in the README) are values Load accepts and uses.
	// Every kind's default instance exists, so that its variables are read.
	base := with(minimal, map[string]string{
		"OUTBOX_PAYMENT_API_KEY": "sk_test_123",
		"OUTBOX_SMTP_ADDR":       "smtp.example.com:587",
		"OUTBOX_EMAIL_FROM":      "outbox@example.com",
		"OUTBOX_SLACK_TOKEN":     "xoxb-123",
	})
	explicit := maps.Clone(base)
	for _, v := range Variables() {
		if v.Default != "" {
			explicit[v.Name] = v.Default
		}
	}
	want, err := Load(environ(base))
	require.NoError(t, err)
	got, err := Load(environ(explicit))
	require.NoError(t, err)
	require.Equal(t, want, got)
}

func TestLoadEveryVariable(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(map[string]string{
		"OUTBOX_DATABASE_URL":         "host=db user=app password=hunter2 pool_max_conns=20",
		"OUTBOX_HTTP_ADDR":            ":9090",
		"OUTBOX_LOG_FORMAT":           "json",
		"OUTBOX_LOG_LEVEL":            "debug",
		"OUTBOX_BATCH_SIZE":           "50",
		"OUTBOX_CONCURRENCY":          "16",
		"OUTBOX_MAX_CLAIMED_BYTES":    "1048576",
		"OUTBOX_LEASE":                "2m",
		"OUTBOX_POLL_INTERVAL":        "250ms",
		"OUTBOX_MAX_ATTEMPTS":         "7",
		"OUTBOX_MAX_AGE":              "24h",
		"OUTBOX_BACKOFF_BASE":         "500ms",
		"OUTBOX_BACKOFF_MAX":          "10m",
		"OUTBOX_RETENTION":            "720h",
		"OUTBOX_SHUTDOWN_TIMEOUT":     "1m30s",
		"OUTBOX_RELAY_ID":             "relay-a",
		"OUTBOX_API_TOKENS":           `[{"name":"agent","sha256":"` + testTokenHash + `","connectors":["webhook:*"]}]`,
		"OUTBOX_APPROVAL_REQUIRED":    "payment, webhook:crm",
		"OUTBOX_API_RATE":             "2.5",
		"OUTBOX_API_MAX_BODY":         "4096",
		"OUTBOX_MCP_TOKEN":            "obx_test",
		"OUTBOX_CONNECTORS":           "webhook:crm",
		"OUTBOX_WEBHOOK_URL":          "http://127.0.0.1:9999/in",
		"OUTBOX_WEBHOOK_SECRET":       "whsec_c2VjcmV0LWRlZmF1bHQ=",
		"OUTBOX_WEBHOOK_TIMEOUT":      "5s",
		"OUTBOX_WEBHOOK_RATE":         "2.5",
		"OUTBOX_WEBHOOK_CONCURRENCY":  "4",
		"OUTBOX_WEBHOOK_GUARANTEE":    "enforced",
		"OUTBOX_WEBHOOK_ON_AMBIGUOUS": "hold",
		"OUTBOX_WEBHOOK_CRM_URL":      "https://crm.example.com/hooks/outbox",
	}))
	require.NoError(t, err)

	require.Equal(t, Config{
		Database: Database{URL: "host=db user=app password=hunter2 pool_max_conns=20"},
		HTTPAddr: ":9090",
		Log:      Log{Format: "json", Level: "debug"},
		Engine: Engine{
			BatchSize:       50,
			Concurrency:     16,
			MaxClaimedBytes: 1 << 20,
			Lease:           2 * time.Minute,
			PollInterval:    250 * time.Millisecond,
			MaxAttempts:     7,
			MaxAge:          24 * time.Hour,
			BackoffBase:     500 * time.Millisecond,
			BackoffMax:      10 * time.Minute,
			Retention:       720 * time.Hour,
			ShutdownTimeout: 90 * time.Second,
			RelayID:         "relay-a",
		},
		API: API{
			TokensJSON:       `[{"name":"agent","sha256":"` + testTokenHash + `","connectors":["webhook:*"]}]`,
			Tokens:           []intent.Token{{Name: "agent", SHA256: testTokenHash, Connectors: []string{"webhook:*"}}},
			ApprovalRequired: []string{"payment", "webhook:crm"},
			Rate:             2.5,
			MaxBody:          4096,
			MCPToken:         "obx_test",
		},
		Connectors: []string{"webhook:crm"},
		Webhooks: []Webhook{
			{
				URL:         "http://127.0.0.1:9999/in",
				Secret:      "whsec_c2VjcmV0LWRlZmF1bHQ=",
				Timeout:     5 * time.Second,
				Rate:        2.5,
				Concurrency: 4,
				Guarantee:   connectors.Enforced,
				OnAmbiguous: relay.AmbiguousHold,
			},
			{
				Name:        "crm",
				URL:         "https://crm.example.com/hooks/outbox",
				Timeout:     10 * time.Second,
				Guarantee:   connectors.Forwarded,
				OnAmbiguous: relay.AmbiguousRetry,
			},
		},
	}, *cfg)
	require.True(t, cfg.Log.JSON())
	require.Equal(t, slog.LevelDebug, cfg.Log.SlogLevel())
}

func TestLoadNamedInstances(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(map[string]string{
		"OUTBOX_DATABASE_URL":                    "postgres://app@localhost/app",
		"OUTBOX_CONNECTORS":                      " webhook:crm , webhook:billing_v2,",
		"OUTBOX_WEBHOOK_CRM_URL":                 "https://crm.example.com/in",
		"OUTBOX_WEBHOOK_CRM_SECRET":              "whsec_Y3JtLXMzY3JldC1rZXk=",
		"OUTBOX_WEBHOOK_CRM_TIMEOUT":             "3s",
		"OUTBOX_WEBHOOK_CRM_RATE":                "10",
		"OUTBOX_WEBHOOK_CRM_CONCURRENCY":         "2",
		"OUTBOX_WEBHOOK_CRM_GUARANTEE":           "Enforced",
		"OUTBOX_WEBHOOK_BILLING_V2_URL":          "https://billing.example.com/in",
		"OUTBOX_WEBHOOK_BILLING_V2_ON_AMBIGUOUS": "HOLD",
	}))
	require.NoError(t, err)

	// No OUTBOX_WEBHOOK_URL: no default instance.
	require.Equal(t, []string{"webhook:crm", "webhook:billing_v2"}, cfg.Instances())
	crm, billing := cfg.Webhooks[0], cfg.Webhooks[1]
	require.Equal(t, Webhook{
		Name:        "crm",
		URL:         "https://crm.example.com/in",
		Secret:      "whsec_Y3JtLXMzY3JldC1rZXk=",
		Timeout:     3 * time.Second,
		Rate:        10,
		Concurrency: 2,
		Guarantee:   connectors.Enforced,
		OnAmbiguous: relay.AmbiguousRetry,
	}, crm)
	require.Equal(t, "OUTBOX_WEBHOOK_CRM_", crm.Prefix())
	require.Equal(t, "billing_v2", billing.Name)
	require.Equal(t, relay.AmbiguousHold, billing.OnAmbiguous)
	require.Equal(t, 10*time.Second, billing.Timeout)

	require.Equal(t, relay.Instance{Concurrency: 2, Rate: 10, OnAmbiguous: relay.AmbiguousRetry}, crm.RelayInstance(nil))
}

func TestLoadProblems(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{
			name: "NothingSet",
			env:  map[string]string{},
			want: []string{`OUTBOX_DATABASE_URL is required but not set`},
		},
		{
			name: "EmptyDSN",
			env:  with(minimal, map[string]string{"OUTBOX_DATABASE_URL": ""}),
			want: []string{`OUTBOX_DATABASE_URL is required but empty`},
		},
		{
			name: "BadDurationAndMissingURL",
			env: with(minimal, map[string]string{
				"OUTBOX_LEASE":      "30",
				"OUTBOX_CONNECTORS": "webhook:crm",
			}),
			want: []string{
				`OUTBOX_LEASE must be a duration such as 500ms, 30s or 1h30m, got "30"`,
				`OUTBOX_WEBHOOK_CRM_URL is required for webhook:crm, which OUTBOX_CONNECTORS names`,
			},
		},
		{
			name: "Numbers",
			env: with(minimal, map[string]string{
				"OUTBOX_BATCH_SIZE":        "lots",
				"OUTBOX_CONCURRENCY":       "0",
				"OUTBOX_MAX_ATTEMPTS":      "-1",
				"OUTBOX_WEBHOOK_RATE":      "fast",
				"OUTBOX_MAX_CLAIMED_BYTES": "0",
			}),
			want: []string{
				`OUTBOX_BATCH_SIZE must be a whole number, got "lots"`,
				`OUTBOX_CONCURRENCY must be positive, got 0`,
				`OUTBOX_MAX_ATTEMPTS must be positive, got -1`,
				`OUTBOX_MAX_CLAIMED_BYTES must be positive, got 0`,
				`OUTBOX_WEBHOOK_RATE must be a number, got "fast"`,
			},
		},
		{
			name: "Durations",
			env: with(minimal, map[string]string{
				"OUTBOX_POLL_INTERVAL":    "0s",
				"OUTBOX_RETENTION":        "-1h",
				"OUTBOX_SHUTDOWN_TIMEOUT": "soon",
				"OUTBOX_BACKOFF_BASE":     "2h",
				"OUTBOX_BACKOFF_MAX":      "1h",
			}),
			want: []string{
				`OUTBOX_SHUTDOWN_TIMEOUT must be a duration such as 500ms, 30s or 1h30m, got "soon"`,
				`OUTBOX_POLL_INTERVAL must be positive, got 0s`,
				`OUTBOX_RETENTION must be positive, got -1h0m0s`,
				`OUTBOX_BACKOFF_BASE (2h0m0s) must not exceed OUTBOX_BACKOFF_MAX (1h0m0s)`,
			},
		},
		{
			name: "BackoffNotComparedWhenOneIsBad",
			env: with(minimal, map[string]string{
				"OUTBOX_BACKOFF_BASE": "2h",
				"OUTBOX_BACKOFF_MAX":  "x",
			}),
			want: []string{`OUTBOX_BACKOFF_MAX must be a duration such as 500ms, 30s or 1h30m, got "x"`},
		},
		{
			name: "LogAndHTTP",
			env: with(minimal, map[string]string{
				"OUTBOX_LOG_FORMAT": "logfmt",
				"OUTBOX_LOG_LEVEL":  "verbose",
				"OUTBOX_HTTP_ADDR":  "8080",
				"OUTBOX_RELAY_ID":   " a ",
			}),
			want: []string{
				`OUTBOX_HTTP_ADDR must be host:port (such as 127.0.0.1:8080 or :8080), got "8080"`,
				`OUTBOX_LOG_FORMAT must be text or json, got "logfmt"`,
				`OUTBOX_LOG_LEVEL must be debug, info, warn or error, got "verbose"`,
				`OUTBOX_RELAY_ID must not start or end with spaces, got " a "`,
			},
		},
		{
			name: "ConnectorsList",
			env: with(minimal, map[string]string{
				"OUTBOX_CONNECTORS":     "webhook,email,smoke:signal,crm,webhook:CRM,webhook:a-b,webhook:ok,webhook:ok,slack:a:b",
				"OUTBOX_WEBHOOK_OK_URL": "https://ok.example.com/",
			}),
			want: []string{
				`OUTBOX_CONNECTORS: "webhook" must be kind:name, such as webhook:crm; the default webhook instance needs no entry (set OUTBOX_WEBHOOK_URL)`,
				`OUTBOX_CONNECTORS: "email" must be kind:name, such as email:crm; the default email instance needs no entry (set OUTBOX_SMTP_ADDR)`,
				`OUTBOX_CONNECTORS: "smoke:signal": connector kind "smoke" is not one of webhook, payment, email, slack`,
				`OUTBOX_CONNECTORS: "crm" must be kind:name, such as webhook:crm`,
				`OUTBOX_CONNECTORS: "webhook:CRM": the instance name must be lower-case letters, digits and underscores`,
				`OUTBOX_CONNECTORS: "webhook:a-b": the instance name must be lower-case letters, digits and underscores`,
				`OUTBOX_CONNECTORS: "webhook:ok" is listed twice`,
				`OUTBOX_CONNECTORS: "slack:a:b": the instance name must be lower-case letters, digits and underscores`,
			},
		},
		{
			name: "DefaultInstanceWithoutURL",
			env: map[string]string{
				"OUTBOX_DATABASE_URL":    "postgres://app@localhost/app",
				"OUTBOX_WEBHOOK_SECRET":  "whsec_c2VjcmV0LWRlZmF1bHQ=",
				"OUTBOX_WEBHOOK_TIMEOUT": "1s",
			},
			want: []string{
				`OUTBOX_WEBHOOK_SECRET is set but OUTBOX_WEBHOOK_URL is not: the default webhook instance needs a URL`,
				`OUTBOX_WEBHOOK_TIMEOUT is set but OUTBOX_WEBHOOK_URL is not: the default webhook instance needs a URL`,
			},
		},
		{
			name: "NamedInstanceNotListed",
			env: with(minimal, map[string]string{
				"OUTBOX_WEBHOOK_CRM_URL":         "https://crm.example.com/",
				"OUTBOX_WEBHOOK_BILLING_V2_RATE": "3",
				"OUTBOX_WEBHOOK_SOMETHING_ELSE":  "not an instance variable",
			}),
			want: []string{
				`OUTBOX_WEBHOOK_BILLING_V2_RATE is set but webhook:billing_v2 is not in OUTBOX_CONNECTORS`,
				`OUTBOX_WEBHOOK_CRM_URL is set but webhook:crm is not in OUTBOX_CONNECTORS`,
			},
		},
		{
			name: "WebhookValues",
			env: with(minimal, map[string]string{
				"OUTBOX_CONNECTORS":            "webhook:a,webhook:b,webhook:c",
				"OUTBOX_WEBHOOK_URL":           "ftp://user:pw@files.example.com/drop?token=t0k3n",
				"OUTBOX_WEBHOOK_GUARANTEE":     "reconciled",
				"OUTBOX_WEBHOOK_ON_AMBIGUOUS":  "panic",
				"OUTBOX_WEBHOOK_A_URL":         "https://a.example.com:x/",
				"OUTBOX_WEBHOOK_A_SECRET":      "whsec_not base64!",
				"OUTBOX_WEBHOOK_C_SECRET":      "c2VjcmV0LWRlZmF1bHQ=",
				"OUTBOX_WEBHOOK_A_RATE":        "-1",
				"OUTBOX_WEBHOOK_A_CONCURRENCY": "-2",
				"OUTBOX_WEBHOOK_B_URL":         "/relative/path",
				"OUTBOX_WEBHOOK_B_RATE":        "NaN",
				"OUTBOX_WEBHOOK_B_TIMEOUT":     "0s",
				"OUTBOX_WEBHOOK_C_URL":         "https://c.example.com/",
				"OUTBOX_WEBHOOK_C_TIMEOUT":     "29.5s",
			}),
			want: []string{
				`OUTBOX_WEBHOOK_URL must be an absolute http or https URL, got "ftp://files.example.com/xxxxx"`,
				`OUTBOX_WEBHOOK_GUARANTEE must be forwarded or enforced, got "reconciled"`,
				`OUTBOX_WEBHOOK_ON_AMBIGUOUS must be retry or hold, got "panic"`,
				`OUTBOX_WEBHOOK_A_URL is not a valid URL: invalid port ":x" after host`,
				`OUTBOX_WEBHOOK_A_SECRET: secret 1 of 2 must be whsec_ followed by base64 (the Standard Webhooks format)`,
				`OUTBOX_WEBHOOK_A_SECRET: secret 2 of 2 must be whsec_ followed by base64 (the Standard Webhooks format)`,
				`OUTBOX_WEBHOOK_A_RATE must be requests per second, 0 for no limit, got -1`,
				`OUTBOX_WEBHOOK_A_CONCURRENCY must not be negative (0 means OUTBOX_CONCURRENCY), got -2`,
				`OUTBOX_WEBHOOK_B_URL must be an absolute http or https URL, got "xxxxx"`,
				`OUTBOX_WEBHOOK_B_TIMEOUT must be positive, got 0s`,
				`OUTBOX_WEBHOOK_B_RATE must be requests per second, 0 for no limit, got NaN`,
				`OUTBOX_WEBHOOK_C_SECRET must be whsec_ followed by base64 (the Standard Webhooks format)`,
				`OUTBOX_WEBHOOK_C_TIMEOUT (29.5s) must be at least 1s shorter than OUTBOX_LEASE (30s), or a slow attempt outlives its lease and another relay sends the row again`,
			},
		},
		{
			// Several secrets: one line for each bad one, naming its place, never the secret.
			name: "WebhookSecretList",
			env: with(minimal, map[string]string{
				"OUTBOX_CONNECTORS":         "webhook:crm",
				"OUTBOX_WEBHOOK_SECRET":     "whsec_c2VjcmV0LWRlZmF1bHQ= c2VjcmV0LW5ldw==\n\twhsec_",
				"OUTBOX_WEBHOOK_CRM_URL":    "https://crm.example.com/",
				"OUTBOX_WEBHOOK_CRM_SECRET": "whsec_Y3JtLXMzY3JldC1rZXk=\nwhsec_Y3JtLW5ldy1rZXk",
			}),
			want: []string{
				`OUTBOX_WEBHOOK_SECRET: secret 2 of 3 must be whsec_ followed by base64 (the Standard Webhooks format)`,
				`OUTBOX_WEBHOOK_SECRET: secret 3 of 3 must be whsec_ followed by base64 (the Standard Webhooks format)`,
				`OUTBOX_WEBHOOK_CRM_SECRET: secret 2 of 2 must be whsec_ followed by base64 (the Standard Webhooks format)`,
			},
		},
		{
			name: "Everything",
			env: map[string]string{
				"OUTBOX_LEASE":           "1 minute",
				"OUTBOX_CONNECTORS":      "webhook:crm,email:ops,sms:ops",
				"OUTBOX_WEBHOOK_TIMEOUT": "5s",
			},
			want: []string{
				`OUTBOX_DATABASE_URL is required but not set`,
				`OUTBOX_LEASE must be a duration such as 500ms, 30s or 1h30m, got "1 minute"`,
				`OUTBOX_CONNECTORS: "sms:ops": connector kind "sms" is not one of webhook, payment, email, slack`,
				`OUTBOX_WEBHOOK_TIMEOUT is set but OUTBOX_WEBHOOK_URL is not: the default webhook instance needs a URL`,
				`OUTBOX_WEBHOOK_CRM_URL is required for webhook:crm, which OUTBOX_CONNECTORS names`,
				`OUTBOX_SMTP_OPS_ADDR is required for email:ops, which OUTBOX_CONNECTORS names (or OUTBOX_EMAIL_OPS_API_KEY, to send through Resend)`,
				`OUTBOX_EMAIL_OPS_FROM is required for email:ops: it is the sender of every message`,
			},
		},
		{
			// url.Parse keeps a space at the end of the path, and it is sent as %20: the
			// receiver would answer 404 to every row, and errors show only the URL's scheme
			// and host. A stray newline from a file is refused as well.
			name: "WebhookURLWhiteSpace",
			env: with(minimal, map[string]string{
				"OUTBOX_CONNECTORS":      "webhook:crm,webhook:ops",
				"OUTBOX_WEBHOOK_URL":     "https://example.com/hook ",
				"OUTBOX_WEBHOOK_CRM_URL": " https://crm.example.com/in",
				"OUTBOX_WEBHOOK_OPS_URL": "https://ops.example.com/in?t=x\n",
			}),
			want: []string{
				`OUTBOX_WEBHOOK_URL must not begin or end with white space: it would be sent as part of the URL`,
				`OUTBOX_WEBHOOK_CRM_URL must not begin or end with white space: it would be sent as part of the URL`,
				`OUTBOX_WEBHOOK_OPS_URL must not begin or end with white space: it would be sent as part of the URL`,
			},
		},
		{
			// The same for the payment connector's API base: its path goes in front of
			// every request's, so "https://api.stripe.com/v1 " sent each to
			// /v1%20/v1/..., which Stripe answers 404, and every row went dead.
			name: "PaymentAPIBaseWhiteSpace",
			env: with(minimal, map[string]string{
				"OUTBOX_CONNECTORS":          "payment:eu",
				"OUTBOX_PAYMENT_API_KEY":     "sk_test_123",
				"OUTBOX_PAYMENT_API_BASE":    "https://api.stripe.com/v1 ",
				"OUTBOX_PAYMENT_EU_API_KEY":  "sk_test_456",
				"OUTBOX_PAYMENT_EU_API_BASE": " https://stripe-proxy.example.com/eu",
			}),
			want: []string{
				`OUTBOX_PAYMENT_API_BASE must not begin or end with white space: it would be sent as part of the URL`,
				`OUTBOX_PAYMENT_EU_API_BASE must not begin or end with white space: it would be sent as part of the URL`,
			},
		},
		{
			// And for the Slack and Resend API bases, whose paths go in front of every
			// request's as well.
			name: "SlackAndResendAPIBaseWhiteSpace",
			env: with(minimal, map[string]string{
				"OUTBOX_SLACK_TOKEN":    "xoxb-123",
				"OUTBOX_SLACK_API_BASE": "https://slack.com/api ",
				"OUTBOX_EMAIL_API_KEY":  "re_123",
				"OUTBOX_EMAIL_FROM":     "outboxd@example.com",
				"OUTBOX_EMAIL_API_BASE": " https://api.resend.com",
			}),
			want: []string{
				`OUTBOX_EMAIL_API_BASE must not begin or end with white space: it would be sent as part of the URL`,
				`OUTBOX_SLACK_API_BASE must not begin or end with white space: it would be sent as part of the URL`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			cfg, err := Load(environ(tt.env))
			require.Nil(t, cfg)
			require.Equal(t, tt.want, problemLines(t, err))
			for _, secret := range []string{"c2VjcmV0LWRlZmF1bHQ", "c2VjcmV0LW5ldw", "Y3JtLXMzY3JldC1rZXk", "Y3JtLW5ldy1rZXk"} {
				require.NotContains(t, err.Error(), secret)
			}

			// The message has a header and one line per problem.
			lines := strings.Split(err.Error(), "\n")
			require.Equal(t, "invalid configuration:", lines[0])
			require.Len(t, lines, len(tt.want)+1)
		})
	}
}

// TestLoadWebhookSecrets reads several signing secrets from one variable, as a secret is
// rotated: separated by spaces, tabs or newlines, each valid, in the order given, and
// handed to the connector, which signs with each. A blank value is no secret at all.
func TestLoadWebhookSecrets(t *testing.T) {
	t.Parallel()

	const (
		old   = "whsec_c2VjcmV0LWRlZmF1bHQ="
		fresh = "whsec_c2VjcmV0LW5ldy1rZXk="
	)
	for name, value := range map[string]string{
		"Space":     old + " " + fresh,
		"Lines":     old + "\n" + fresh + "\n",
		"TabsAndCR": "\t" + old + "\r\n\t" + fresh,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := Load(environ(with(minimal, map[string]string{"OUTBOX_WEBHOOK_SECRET": value})))
			require.NoError(t, err)
			w := cfg.Webhooks[0]
			require.Equal(t, []string{old, fresh}, strings.Fields(w.Secret.Reveal()))

			// The connector takes the value as Load read it.
			_, err = webhook.New(webhook.Config{URL: w.URL, Secret: w.Secret.Reveal()})
			require.NoError(t, err)

			var text, js bytes.Buffer
			slog.New(slog.NewTextHandler(&text, nil)).Info("starting", "config", cfg)
			slog.New(slog.NewJSONHandler(&js, nil)).Info("starting", "config", cfg)
			for how, out := range map[string]string{
				"slog text": text.String(),
				"slog json": js.String(),
				"%v":        fmt.Sprintf("%v", cfg),
				"%+v":       fmt.Sprintf("%+v", *cfg),
				"%#v":       fmt.Sprintf("%#v", cfg),
				"webhook":   fmt.Sprintf("%v %+v %#v", w, w, w),
			} {
				for _, secret := range []string{"c2VjcmV0LWRlZmF1bHQ", "c2VjcmV0LW5ldy1rZXk"} {
					require.NotContains(t, out, secret, how)
				}
			}
			require.Contains(t, text.String(), "config.webhook.secret=xxxxx")
		})
	}

	t.Run("Blank", func(t *testing.T) {
		t.Parallel()
		cfg, err := Load(environ(with(minimal, map[string]string{"OUTBOX_WEBHOOK_SECRET": " \n\t"})))
		require.NoError(t, err)
		w := cfg.Webhooks[0]
		require.Empty(t, w.Secret, "a blank value means unsigned, as an empty one does")
		require.Contains(t, w.String(), " secret= ")
	})
}

func TestLoadNoSecretInProblems(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(map[string]string{
		"OUTBOX_DATABASE_URL":   "postgres://app:hunter2@localhost/app",
		"OUTBOX_WEBHOOK_URL":    "gopher://user:urlpass@example.com/hook?token=tok3n",
		"OUTBOX_WEBHOOK_SECRET": "whsec_s3cret",
		"OUTBOX_LOG_LEVEL":      "loud",
	}))
	require.Error(t, err)
	for _, secret := range []string{"hunter2", "urlpass", "tok3n", "whsec_s3cret"} {
		require.NotContains(t, err.Error(), secret)
	}
}

func TestLoadDatabase(t *testing.T) {
	t.Parallel()

	db, err := LoadDatabase([]string{"OUTBOX_DATABASE_URL=postgres://a@b/c", "UNRELATED=1"})
	require.NoError(t, err)
	require.Equal(t, "postgres://a@b/c", db.URL)

	_, err = LoadDatabase(nil)
	require.Equal(t, []string{"OUTBOX_DATABASE_URL is required but not set"}, problemLines(t, err))
}

func TestLoadLog(t *testing.T) {
	t.Parallel()

	l, err := LoadLog([]string{"OUTBOX_LOG_LEVEL=WARN"})
	require.NoError(t, err)
	require.False(t, l.JSON())
	require.Equal(t, "WARN", l.SlogLevel().String())

	_, err = LoadLog([]string{"OUTBOX_LOG_FORMAT=xml"})
	require.Equal(t, []string{`OUTBOX_LOG_FORMAT must be text or json, got "xml"`}, problemLines(t, err))
}

func TestConfigRelay(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(with(minimal, map[string]string{
		"OUTBOX_RELAY_ID":     "r1",
		"OUTBOX_BACKOFF_BASE": "2s",
	})))
	require.NoError(t, err)
	require.Equal(t, &relay.Config{
		ID:              "r1",
		BatchSize:       1000,
		Concurrency:     128,
		MaxClaimedBytes: 128 << 20,
		Lease:           30 * time.Second,
		PollInterval:    time.Second,
		MaxAttempts:     25,
		MaxAge:          72 * time.Hour,
		BackoffBase:     2 * time.Second,
		BackoffMax:      time.Hour,
		Retention:       168 * time.Hour,
		ShutdownTimeout: 30 * time.Second,
	}, cfg.Relay())
}

func TestProblems(t *testing.T) {
	t.Parallel()

	require.NoError(t, Problems(nil))

	err := Problems(errors.Join(errors.New("a"), errors.Join(errors.New("b\nc"), errors.New("d"))))
	require.Equal(t, "invalid configuration:\n- a\n- b c\n- d", err.Error())
}

// testTokenHash is the SHA-256 of "obx_test", the token the tests configure.
var testTokenHash = func() string {
	sum := sha256.Sum256([]byte("obx_test"))
	return hex.EncodeToString(sum[:])
}()

func TestLoadAPIProblems(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(map[string]string{
		"OUTBOX_DATABASE_URL": "postgres://localhost/x",
		"OUTBOX_API_TOKENS":   `[{"name":"a","sha256":"zz","connectors":[]},{"name":"a","sha256":"` + testTokenHash + `","connectors":["webhook"]}]`,
		"OUTBOX_API_RATE":     "-1",
		"OUTBOX_API_MAX_BODY": "0",
		// A typo here would leave the approval gate open without a word.
		"OUTBOX_APPROVAL_REQUIRED": "payment,Payment,payments,payment:EU,,webhook:crm,",
	}))
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	msg := err.Error()
	for _, bad := range []string{"Payment", "payments", "payment:EU"} {
		require.Contains(t, msg, fmt.Sprintf("OUTBOX_APPROVAL_REQUIRED: %q is not a connector kind (webhook, payment, email, slack), "+
			"kind:name with a lowercase name, kind:* or *", bad))
	}
	require.NotContains(t, msg, `"webhook:crm" is not`)
	require.Contains(t, msg, `OUTBOX_API_TOKENS: token "a": sha256 must be 64 hex digits`)
	require.Contains(t, msg, `OUTBOX_API_TOKENS: token "a": connectors is empty`)
	require.Contains(t, msg, `OUTBOX_API_TOKENS: token "a": name is used by another token`)
	require.Contains(t, msg, "OUTBOX_API_RATE must be requests per second, 0 for no limit, got -1")
	require.Contains(t, msg, "OUTBOX_API_MAX_BODY must be positive")
	require.Len(t, cerr.Problems, 8)

	_, err = LoadAPI(environ(map[string]string{
		"OUTBOX_API_TOKENS": `[{"name":"a","sha256":"` + testTokenHash + `","connectors":["*"]}]`,
		"OUTBOX_MCP_TOKEN":  "obx_wrong",
	}))
	require.ErrorContains(t, err, "OUTBOX_MCP_TOKEN matches none of OUTBOX_API_TOKENS")
	require.NotContains(t, err.Error(), "obx_wrong")

	api, err := LoadAPI(environ(map[string]string{
		"OUTBOX_API_TOKENS": `[{"name":"a","sha256":"` + testTokenHash + `","connectors":["*"]}]`,
		"OUTBOX_MCP_TOKEN":  "obx_test",
	}))
	require.NoError(t, err)
	tok, err := api.Policy().Authenticate(api.MCPToken.Reveal())
	require.NoError(t, err)
	require.Equal(t, "a", tok.Name)
}

// TestApprovalRequiredTakesWildcards: the intent policy requires approval for "kind:*"
// (every instance of the kind) and "*" (every connector), as a token's connectors are
// written, and Load refused both as names that "would require approval of nothing".
func TestApprovalRequiredTakesWildcards(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(with(minimal, map[string]string{"OUTBOX_APPROVAL_REQUIRED": "payment:*, *"})))
	require.NoError(t, err)
	require.Equal(t, []string{"payment:*", "*"}, cfg.API.ApprovalRequired)

	// Only a known kind takes the wildcard.
	_, err = Load(environ(with(minimal, map[string]string{"OUTBOX_APPROVAL_REQUIRED": "payments:*"})))
	require.ErrorContains(t, err, `OUTBOX_APPROVAL_REQUIRED: "payments:*" is not`)
}

// TestAPIRateMustBeANumber: OUTBOX_API_RATE=NaN parses as a float, and so does Inf (or
// inf, infinity), and the intent API then limits nothing; the connector instances' RATE
// refuses them, and so must this, in one line.
func TestAPIRateMustBeANumber(t *testing.T) {
	t.Parallel()

	for _, v := range []string{"NaN", "nan", "Inf", "+inf", "infinity"} {
		_, err := LoadAPI([]string{"OUTBOX_API_RATE=" + v})
		require.Error(t, err, "OUTBOX_API_RATE=%s is accepted", v)
		require.Len(t, err.(*Error).Problems, 1, "%v", err)
		require.Contains(t, err.Error(), "OUTBOX_API_RATE must be requests per second, 0 for no limit, got ")
		_, err = Load([]string{"OUTBOX_DATABASE_URL=postgres://app@localhost/app", "OUTBOX_WEBHOOK_URL=http://127.0.0.1/h", "OUTBOX_API_RATE=" + v})
		require.Error(t, err, "OUTBOX_API_RATE=%s is accepted", v)
	}
}

// TestInvalidDSNNeverQuotesItsPassword: a DSN that is almost a postgres URL (a scheme
// pgx does not take, a space before it, upper case) does not parse, and the problem
// quotes it: its password must be masked there too.
func TestInvalidDSNNeverQuotesItsPassword(t *testing.T) {
	t.Parallel()

	for _, dsn := range []string{
		"POSTGRES://app:hunter2@db.example.com/app",
		" postgres://app:hunter2@db.example.com/app",
		"\tpostgres://app:hunter2@db.example.com/app",
		"jdbc:postgresql://app:hunter2@db.example.com:5432/app",
		"postgress://app:hunter2@db.example.com/app",
		"postgres:/app:hunter2@db.example.com/app",
		"postgis://app:hunter2@db.example.com/app",
	} {
		_, err := LoadDatabase([]string{"OUTBOX_DATABASE_URL=" + dsn})
		require.Error(t, err, dsn)
		require.Contains(t, err.Error(), "OUTBOX_DATABASE_URL (", dsn)
		require.NotContains(t, err.Error(), "hunter2", dsn)
		require.NotContains(t, RedactDSN(dsn), "hunter2", dsn)
	}
}

// TestLoadOptionalDatabase: demo and bench start a database of their own only when
// OUTBOX_DATABASE_URL is not given; one that is given but does not parse is an error.
func TestLoadOptionalDatabase(t *testing.T) {
	t.Parallel()

	for _, environ := range [][]string{nil, {"OUTBOX_DATABASE_URL="}} {
		_, given, err := LoadOptionalDatabase(environ)
		require.NoError(t, err)
		require.False(t, given)
	}
	db, given, err := LoadOptionalDatabase([]string{"OUTBOX_DATABASE_URL=postgres://app@localhost/app"})
	require.NoError(t, err)
	require.True(t, given)
	require.Equal(t, "postgres://app@localhost/app", db.URL)
	_, given, err = LoadOptionalDatabase([]string{"OUTBOX_DATABASE_URL=postgres://app:hunter2@localhost:54x32/app"})
	require.ErrorContains(t, err, "OUTBOX_DATABASE_URL")
	require.NotContains(t, err.Error(), "hunter2")
	require.False(t, given)
}

// A webhook URL whose password holds a character that ends the authority ('/', '?',
// '#': common in base64 or generated tokens) does not parse, and url.Parse's reason
// quotes what it took for the port: the password's start. The problem is printed at
// start, so it must not carry the reason.
func TestURLPasswordNeverInProblems(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"https://hook:Zm9vYmFy/x+Q@example.com/hook",
		"https://hook:s3cr3tPart?rest@example.com/hook",
		"https://hook:s3cr3tPart#rest@example.com/hook",
	} {
		_, err := Load(environ(map[string]string{
			"OUTBOX_DATABASE_URL": "postgres://app@localhost/app",
			"OUTBOX_WEBHOOK_URL":  u,
		}))
		require.ErrorContains(t, err, "OUTBOX_WEBHOOK_URL is not a valid URL: the reason is not shown", u)
		for _, secret := range []string{"Zm9vYmFy", "s3cr3tPart"} {
			require.NotContains(t, err.Error(), secret, "URL %s", u)
		}
	}
}

// TestLoadNumberOutOfRange: a whole number too large for its variable was reported as
// not a whole number ("OUTBOX_CONCURRENCY must be a whole number, got \"1000000000000\""),
// which sends a reader looking for a typo that is not there.
func TestLoadNumberOutOfRange(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(with(minimal, map[string]string{
		"OUTBOX_CONCURRENCY":  "1000000000000",
		"OUTBOX_API_MAX_BODY": "-99999999999999999999",
		"OUTBOX_API_RATE":     "1e400",
		"OUTBOX_BATCH_SIZE":   "12x",
	})))
	require.Equal(t, []string{
		`OUTBOX_BATCH_SIZE must be a whole number, got "12x"`,
		`OUTBOX_CONCURRENCY is out of range, got "1000000000000"`,
		`OUTBOX_API_RATE is out of range, got "1e400"`,
		`OUTBOX_API_MAX_BODY is out of range, got "-99999999999999999999"`,
	}, problemLines(t, err))
}

// TestLoadDurationOutOfRange: a duration longer than Go's time.Duration holds (about
// 2562047h), such as a maximum age meant as "never give up", was reported as not a
// duration ("OUTBOX_MAX_AGE must be a duration such as 500ms, 30s or 1h30m, got
// \"100000000h\""), which it is; it is out of range, as a number too large is. A
// value that is not a duration still says what one looks like.
func TestLoadDurationOutOfRange(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(with(minimal, map[string]string{
		"OUTBOX_MAX_AGE":         "100000000h",
		"OUTBOX_RETENTION":       "-9999999999999999999ns",
		"OUTBOX_WEBHOOK_TIMEOUT": "2562047h47m16.854775808s",
		"OUTBOX_LEASE":           "30 s",
		"OUTBOX_BACKOFF_MAX":     "1d",
		"OUTBOX_POLL_INTERVAL":   "10",
	})))
	require.Equal(t, []string{
		`OUTBOX_LEASE must be a duration such as 500ms, 30s or 1h30m, got "30 s"`,
		`OUTBOX_POLL_INTERVAL must be a duration such as 500ms, 30s or 1h30m, got "10"`,
		`OUTBOX_MAX_AGE is out of range (at most 2562047h), got "100000000h"`,
		`OUTBOX_BACKOFF_MAX must be a duration such as 500ms, 30s or 1h30m, got "1d"`,
		`OUTBOX_RETENTION is out of range (at most 2562047h), got "-9999999999999999999ns"`,
		`OUTBOX_WEBHOOK_TIMEOUT is out of range (at most 2562047h), got "2562047h47m16.854775808s"`,
	}, problemLines(t, err))
	_, err = Load(environ(with(minimal, map[string]string{"OUTBOX_MAX_AGE": "2562047h", "OUTBOX_RETENTION": "+1.5h", "OUTBOX_LEASE": ".5h"})))
	require.NoError(t, err)
}

// TestLoadURLPortOutOfRange: url.Parse takes any digits for a port, so a mistyped one
// (99999) passed the start and every attempt then failed as a network error, retried
// for days until each row was dead.
func TestLoadURLPortOutOfRange(t *testing.T) {
	t.Parallel()
	_, err := Load(environ(with(minimal, map[string]string{
		"OUTBOX_WEBHOOK_URL":    "https://hooks.example.com:99999/in",
		"OUTBOX_SLACK_TOKEN":    "xoxb-1",
		"OUTBOX_SLACK_API_BASE": "http://127.0.0.1:0/api/",
	})))
	require.Error(t, err)
	require.Contains(t, err.Error(), "OUTBOX_WEBHOOK_URL is not a valid URL: port 99999 is not between 1 and 65535")
	require.Contains(t, err.Error(), "OUTBOX_SLACK_API_BASE is not a valid URL: port 0 is not between 1 and 65535")
}

// TestLoadMaxAttemptsBeyondInt4: attempts is an int4 column, and relay.New refuses a
// larger MaxAttempts; serve refuses it with the configuration's problems (exit 2), not
// from relay.New (exit 1).
func TestLoadMaxAttemptsBeyondInt4(t *testing.T) {
	t.Parallel()
	_, err := Load(environ(with(minimal, map[string]string{"OUTBOX_MAX_ATTEMPTS": "2147483648"})))
	require.Equal(t, []string{`OUTBOX_MAX_ATTEMPTS is out of range, got "2147483648"`}, problemLines(t, err))
	_, err = Load(environ(with(minimal, map[string]string{"OUTBOX_MAX_ATTEMPTS": "2147483647"})))
	require.NoError(t, err)
}

// TestLoadRelayIDTooLong: the relay refuses an ID past relay.MaxIDLength bytes; serve
// says so with the configuration's problems.
func TestLoadRelayIDTooLong(t *testing.T) {
	t.Parallel()
	_, err := Load(environ(with(minimal, map[string]string{"OUTBOX_RELAY_ID": strings.Repeat("r", 256)})))
	require.Equal(t, []string{`OUTBOX_RELAY_ID must be at most 255 bytes, got 256`}, problemLines(t, err))
}

// TestLoadUnknownVariables: a misspelt variable (OUTBOX_WEBHOOK_SECERT, OUTBOX_LEAES, a
// named instance's in lower case) is read by nothing, so without a word it would leave
// requests unsigned or the lease at its default. Load lists every OUTBOX_ variable it
// does not read, for serve to warn about.
func TestLoadUnknownVariables(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(with(minimal, map[string]string{
		"OUTBOX_CONNECTORS":         "webhook:crm,email:support",
		"OUTBOX_WEBHOOK_CRM_URL":    "https://crm.example.com/hook",
		"OUTBOX_SMTP_SUPPORT_ADDR":  "smtp.example.com:587",
		"OUTBOX_EMAIL_SUPPORT_FROM": "support@example.com",
		"OUTBOX_WEBHOOK_SECRET":     "whsec_c2VjcmV0",
		// Read by the test helper, not by outboxd, and documented.
		"OUTBOX_TEST_DATABASE_URL": "postgres://localhost/test",
		// Misspelt.
		"OUTBOX_WEBHOOK_SECERT":     "whsec_c2VjcmV0",
		"OUTBOX_LEAES":              "5m",
		"OUTBOX_WEBHOOK_crm_SECRET": "whsec_c2VjcmV0",
		"outbox_max_attempts":       "3",
		"OUTBOX_WEBHOK_URL":         "",
		// Not ours at all.
		"PATH": "/usr/bin",
	})))
	require.NoError(t, err)
	require.Equal(t, []string{
		"OUTBOX_LEAES", "OUTBOX_WEBHOK_URL", "OUTBOX_WEBHOOK_SECERT", "OUTBOX_WEBHOOK_crm_SECRET", "outbox_max_attempts",
	}, cfg.Unknown)

	cfg, err = Load(environ(minimal))
	require.NoError(t, err)
	require.Empty(t, cfg.Unknown)
}

// TestLoadUnknownVariablesWithProblems: a misspelt variable is most often what a problem
// is about (OUTBOX_WEBHOOK_CRM_ULR, for the OUTBOX_WEBHOOK_CRM_URL that webhook:crm
// requires), so a Load that fails lists the variables it does not read too, for serve
// to warn about with the problems; but not those a problem names already.
func TestLoadUnknownVariablesWithProblems(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(with(minimal, map[string]string{
		"OUTBOX_CONNECTORS":      "webhook:crm",
		"OUTBOX_WEBHOOK_CRM_ULR": "https://crm.example.com/hook",
		"OUTBOX_WEBHOOK_CRN_URL": "https://crm.example.com/hook", // a problem: webhook:crn is not listed
	})))
	require.Equal(t, []string{
		"OUTBOX_WEBHOOK_CRM_URL is required for webhook:crm, which OUTBOX_CONNECTORS names",
		"OUTBOX_WEBHOOK_CRN_URL is set but webhook:crn is not in OUTBOX_CONNECTORS",
	}, problemLines(t, err))
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	require.Equal(t, []string{"OUTBOX_WEBHOOK_CRM_ULR"}, cerr.Unknown)
}

// TestMCPTokenNotBlamedForBadTokens: when OUTBOX_API_TOKENS does not parse, the
// problem is that variable's alone; saying that OUTBOX_MCP_TOKEN matches none of the
// tokens would send the operator after the MCP token, which may be the right one.
func TestMCPTokenNotBlamedForBadTokens(t *testing.T) {
	t.Parallel()

	_, err := LoadAPI(environ(map[string]string{
		"OUTBOX_API_TOKENS": `[{"name":"a","sha256":"` + testTokenHash + `","connectors":["*"]}`, // no closing ]
		"OUTBOX_MCP_TOKEN":  "obx_test",
	}))
	require.Equal(t, []string{
		"OUTBOX_API_TOKENS: tokens are not a JSON array of {name, sha256, connectors, admin}: unexpected EOF",
	}, problemLines(t, err))
}

// TestLoadRelayIDNotUTF8: the relay refuses an ID that is not UTF-8 (PostgreSQL would
// refuse it in every claim); Load refuses it first, as a problem with the variable, so
// serve exits 2 with the others rather than 1 after building the relay.
func TestLoadRelayIDNotUTF8(t *testing.T) {
	t.Parallel()
	_, err := Load(environ(with(minimal, map[string]string{"OUTBOX_RELAY_ID": "relay\xff"})))
	require.Equal(t, []string{`OUTBOX_RELAY_ID must be UTF-8 text, got "relay\xff"`}, problemLines(t, err))
}

// TestLoadDatabaseOnlyWhiteSpace: pgx reads a DSN of white space as it reads an empty
// one, as "connect to the defaults" (a local server, the OS user's database), so a
// stray space in OUTBOX_DATABASE_URL= must not pass for a DSN: serve refuses it as it
// refuses an empty one, and demo starts its own database as it does when none is given.
func TestLoadDatabaseOnlyWhiteSpace(t *testing.T) {
	t.Parallel()

	for _, blank := range []string{" ", "\t", " \n "} {
		_, err := LoadDatabase([]string{"OUTBOX_DATABASE_URL=" + blank})
		require.Equal(t, []string{"OUTBOX_DATABASE_URL is required but holds only white space"}, problemLines(t, err))

		_, err = Load(environ(with(minimal, map[string]string{"OUTBOX_DATABASE_URL": blank})))
		require.Equal(t, []string{"OUTBOX_DATABASE_URL is required but holds only white space"}, problemLines(t, err))

		_, given, err := LoadOptionalDatabase([]string{"OUTBOX_DATABASE_URL=" + blank})
		require.NoError(t, err)
		require.False(t, given)
	}
}

// TestMCPTokenWithNewline: a token read from a file or a Kubernetes secret often ends
// with a newline. OUTBOX_MCP_TOKEN was then said to match none of OUTBOX_API_TOKENS,
// sending the operator to compare hashes that are right; the problem now says what is
// wrong, as for the connectors' keys, and never quotes the token.
func TestMCPTokenWithNewline(t *testing.T) {
	t.Parallel()

	_, err := LoadAPI(environ(map[string]string{
		"OUTBOX_API_TOKENS": `[{"name":"a","sha256":"` + testTokenHash + `","connectors":["*"]}]`,
		"OUTBOX_MCP_TOKEN":  "obx_test\n",
	}))
	require.Equal(t, []string{"OUTBOX_MCP_TOKEN must not contain spaces or newlines"}, problemLines(t, err))
}

// TestLoadPollIntervalFloor: an idle relay claims once per OUTBOX_POLL_INTERVAL for each
// instance, so OUTBOX_POLL_INTERVAL=1ns was taken and ran about 7,000 claims a second
// against a database with nothing to deliver. Below 10ms is refused, in one line.
func TestLoadPollIntervalFloor(t *testing.T) {
	t.Parallel()

	for _, v := range []string{"1ns", "1us", "1ms", "9.999ms"} {
		_, err := Load(environ(with(minimal, map[string]string{"OUTBOX_POLL_INTERVAL": v})))
		lines := problemLines(t, err)
		require.Len(t, lines, 1, v)
		require.Contains(t, lines[0], "OUTBOX_POLL_INTERVAL must be at least 10ms", v)
	}
	for _, v := range []string{"10ms", "50ms", "1s", "1h"} {
		cfg, err := Load(environ(with(minimal, map[string]string{"OUTBOX_POLL_INTERVAL": v})))
		require.NoError(t, err, v)
		want, _ := time.ParseDuration(v)
		require.Equal(t, want, cfg.Engine.PollInterval)
	}
}

// TestLeaseAndAPIRateBounds: OUTBOX_LEASE=2562047h was accepted, and a dead relay's
// rows then never came back; OUTBOX_API_RATE=1e-9 allowed a token one request, then the
// next in 30 years. Each is refused with one line; the bounds themselves are taken.
func TestLeaseAndAPIRateBounds(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(with(minimal, map[string]string{"OUTBOX_LEASE": "2562047h", "OUTBOX_API_RATE": "1e-9"})))
	require.Equal(t, []string{
		"OUTBOX_LEASE must be at most 24h0m0s (a dead relay's rows come back only when their lease ends), got 2562047h0m0s",
		"OUTBOX_API_RATE must be 0 (no limit) or at least 0.000278 (one request an hour), got 1e-09",
	}, problemLines(t, err))
	_, err = LoadAPI([]string{"OUTBOX_API_RATE=0.0001"})
	require.ErrorContains(t, err, "OUTBOX_API_RATE must be 0 (no limit) or at least 0.000278")

	for _, v := range []string{"0.000278", "0", "10"} {
		_, err = Load(environ(with(minimal, map[string]string{"OUTBOX_LEASE": "24h", "OUTBOX_API_RATE": v})))
		require.NoError(t, err, v)
	}
}
