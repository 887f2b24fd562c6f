package config

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/relay"
)

var db = map[string]string{"OUTBOX_DATABASE_URL": "postgres://app@localhost/app"}

func TestLoadPayment(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(with(db, map[string]string{
		"OUTBOX_PAYMENT_API_KEY":        "sk_test_default",
		"OUTBOX_CONNECTORS":             "payment:eu",
		"OUTBOX_PAYMENT_EU_API_KEY":     "rk_live_eu",
		"OUTBOX_PAYMENT_EU_API_BASE":    "http://127.0.0.1:12111",
		"OUTBOX_PAYMENT_EU_TIMEOUT":     "5s",
		"OUTBOX_PAYMENT_EU_RATE":        "25",
		"OUTBOX_PAYMENT_EU_CONCURRENCY": "8",
	})))
	require.NoError(t, err)
	require.Equal(t, []string{"payment", "payment:eu"}, cfg.Instances())
	require.Equal(t, []Payment{
		{APIKey: "sk_test_default", APIBase: "https://api.stripe.com", Timeout: 20 * time.Second},
		{Name: "eu", APIKey: "rk_live_eu", APIBase: "http://127.0.0.1:12111", Timeout: 5 * time.Second, Rate: 25, Concurrency: 8},
	}, cfg.Payments)
	require.Equal(t, "OUTBOX_PAYMENT_EU_", cfg.Payments[1].Prefix())
	require.Equal(t, relay.Instance{Rate: 25, Concurrency: 8}, cfg.Payments[1].RelayInstance(nil))
}

func TestLoadEmail(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(with(db, map[string]string{
		"OUTBOX_SMTP_ADDR":                  "smtp.example.com:587",
		"OUTBOX_EMAIL_FROM":                 "Outbox <outbox@example.com>",
		"OUTBOX_CONNECTORS":                 "email:support",
		"OUTBOX_SMTP_SUPPORT_ADDR":          "127.0.0.1:1025",
		"OUTBOX_SMTP_SUPPORT_USERNAME":      "support",
		"OUTBOX_SMTP_SUPPORT_PASSWORD":      "pa ss word",
		"OUTBOX_SMTP_SUPPORT_TLS":           "None",
		"OUTBOX_SMTP_SUPPORT_TIMEOUT":       "3s",
		"OUTBOX_EMAIL_SUPPORT_FROM":         "support@example.com",
		"OUTBOX_EMAIL_SUPPORT_RATE":         "1.5",
		"OUTBOX_EMAIL_SUPPORT_CONCURRENCY":  "2",
		"OUTBOX_EMAIL_SUPPORT_ON_AMBIGUOUS": "hold",
	})))
	require.NoError(t, err)
	require.Equal(t, []string{"email", "email:support"}, cfg.Instances())
	require.Equal(t, []Email{
		{
			SMTP:          SMTP{Addr: "smtp.example.com:587", TLS: "opportunistic", Timeout: 20 * time.Second},
			EmailSettings: EmailSettings{Transport: "smtp", From: "Outbox <outbox@example.com>", OnAmbiguous: relay.AmbiguousRetry},
			ResendAPI:     ResendAPI{APIBase: "https://api.resend.com", APITimeout: 20 * time.Second},
		},
		{
			Name: "support",
			SMTP: SMTP{
				Addr: "127.0.0.1:1025", Username: "support", Password: "pa ss word",
				TLS: "none", Timeout: 3 * time.Second,
			},
			EmailSettings: EmailSettings{Transport: "smtp", From: "support@example.com", Rate: 1.5, Concurrency: 2, OnAmbiguous: relay.AmbiguousHold},
			ResendAPI:     ResendAPI{APIBase: "https://api.resend.com", APITimeout: 20 * time.Second},
		},
	}, cfg.Emails)
	// SMTPS (port 465) needs TLS from the start.
	smtps, err := Load(environ(with(db, map[string]string{
		"OUTBOX_SMTP_ADDR": "smtp.example.com:465", "OUTBOX_SMTP_TLS": "Implicit", "OUTBOX_EMAIL_FROM": "outbox@example.com",
	})))
	require.NoError(t, err)
	require.Equal(t, SMTPTLSImplicit, smtps.Emails[0].TLS)
	support := cfg.Emails[1]
	require.Equal(t, "OUTBOX_SMTP_SUPPORT_", support.SMTPPrefix())
	require.Equal(t, "OUTBOX_EMAIL_SUPPORT_", support.EmailPrefix())
	require.Equal(t, relay.Instance{Rate: 1.5, Concurrency: 2, OnAmbiguous: relay.AmbiguousHold}, support.RelayInstance(nil))
}

func TestLoadSlack(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(with(db, map[string]string{
		"OUTBOX_SLACK_TOKEN":             "xoxb-default",
		"OUTBOX_CONNECTORS":              "slack:ops",
		"OUTBOX_SLACK_OPS_TOKEN":         "xoxb-ops",
		"OUTBOX_SLACK_OPS_API_BASE":      "http://127.0.0.1:9999/api",
		"OUTBOX_SLACK_OPS_TIMEOUT":       "4s",
		"OUTBOX_SLACK_OPS_HISTORY_LIMIT": "999",
		"OUTBOX_SLACK_OPS_RATE":          "1",
		"OUTBOX_SLACK_OPS_CONCURRENCY":   "1",
	})))
	require.NoError(t, err)
	require.Equal(t, []string{"slack", "slack:ops"}, cfg.Instances())
	require.Equal(t, []Slack{
		{Token: "xoxb-default", APIBase: "https://slack.com/api/", Timeout: 20 * time.Second, HistoryLimit: 100},
		{Name: "ops", Token: "xoxb-ops", APIBase: "http://127.0.0.1:9999/api", Timeout: 4 * time.Second, HistoryLimit: 999, Rate: 1, Concurrency: 1},
	}, cfg.Slacks)
	require.Equal(t, "OUTBOX_SLACK_OPS_", cfg.Slacks[1].Prefix())
	require.Equal(t, relay.Instance{Rate: 1, Concurrency: 1}, cfg.Slacks[1].RelayInstance(nil))
}

func TestLoadAllKindsOrder(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(with(minimal, map[string]string{
		"OUTBOX_CONNECTORS":         "slack:b,email:b,payment:b,webhook:b",
		"OUTBOX_SLACK_TOKEN":        "xoxb-1",
		"OUTBOX_SLACK_B_TOKEN":      "xoxb-2",
		"OUTBOX_SMTP_B_ADDR":        "mail:25",
		"OUTBOX_EMAIL_B_FROM":       "b@example.com",
		"OUTBOX_PAYMENT_B_API_KEY":  "sk_b",
		"OUTBOX_WEBHOOK_B_URL":      "https://b.example.com/",
		"OUTBOX_PAYMENT_API_KEY":    "sk_a",
		"OUTBOX_WEBHOOK_B_TIMEOUT":  "1s",
		"OUTBOX_SLACK_B_RATE":       "0",
		"OUTBOX_EMAIL_B_RATE":       "0",
		"OUTBOX_PAYMENT_B_RATE":     "0",
		"OUTBOX_SMTP_B_TLS":         "mandatory",
		"OUTBOX_SLACK_B_API_BASE":   "https://slack.example.com/api/",
		"OUTBOX_PAYMENT_B_API_BASE": "https://stripe.example.com",
	})))
	require.NoError(t, err)
	require.Equal(t, []string{
		"webhook", "webhook:b", "payment", "payment:b", "email:b", "slack", "slack:b",
	}, cfg.Instances())
}

func TestLoadKindProblems(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{
			name: "NamedMissingRequired",
			env: with(db, map[string]string{
				"OUTBOX_CONNECTORS": "payment:eu,email:support,slack:ops",
			}),
			want: []string{
				`OUTBOX_PAYMENT_EU_API_KEY is required for payment:eu, which OUTBOX_CONNECTORS names`,
				`OUTBOX_SMTP_SUPPORT_ADDR is required for email:support, which OUTBOX_CONNECTORS names (or OUTBOX_EMAIL_SUPPORT_API_KEY, to send through Resend)`,
				`OUTBOX_EMAIL_SUPPORT_FROM is required for email:support: it is the sender of every message`,
				`OUTBOX_SLACK_OPS_TOKEN is required for slack:ops, which OUTBOX_CONNECTORS names`,
			},
		},
		{
			name: "DefaultEmailWithoutFrom",
			env:  with(db, map[string]string{"OUTBOX_SMTP_ADDR": "smtp.example.com:25"}),
			want: []string{`OUTBOX_EMAIL_FROM is required for email: it is the sender of every message`},
		},
		{
			name: "DefaultInstancesWithoutKey",
			env: with(minimal, map[string]string{
				"OUTBOX_PAYMENT_API_BASE":    "https://api.stripe.com",
				"OUTBOX_SMTP_PASSWORD":       "hunter2",
				"OUTBOX_EMAIL_FROM":          "a@example.com",
				"OUTBOX_SLACK_HISTORY_LIMIT": "5",
			}),
			want: []string{
				`OUTBOX_PAYMENT_API_BASE is set but OUTBOX_PAYMENT_API_KEY is not: the default payment instance needs an API key`,
				`OUTBOX_SMTP_PASSWORD is set but OUTBOX_SMTP_ADDR is not: the default email instance needs an SMTP server address, or OUTBOX_EMAIL_API_KEY to send through Resend`,
				`OUTBOX_EMAIL_FROM is set but OUTBOX_SMTP_ADDR is not: the default email instance needs an SMTP server address, or OUTBOX_EMAIL_API_KEY to send through Resend`,
				`OUTBOX_SLACK_HISTORY_LIMIT is set but OUTBOX_SLACK_TOKEN is not: the default slack instance needs a token`,
			},
		},
		{
			name: "NamedNotListed",
			env: with(minimal, map[string]string{
				"OUTBOX_PAYMENT_EU_API_KEY":     "sk_x",
				"OUTBOX_SMTP_SUPPORT_ADDR":      "mail:25",
				"OUTBOX_EMAIL_SUPPORT_FROM":     "a@example.com",
				"OUTBOX_SLACK_OPS_TOKEN":        "xoxb-x",
				"OUTBOX_SLACK_HISTORY_ANYTHING": "x",
			}),
			want: []string{
				`OUTBOX_PAYMENT_EU_API_KEY is set but payment:eu is not in OUTBOX_CONNECTORS`,
				`OUTBOX_SMTP_SUPPORT_ADDR is set but email:support is not in OUTBOX_CONNECTORS`,
				`OUTBOX_EMAIL_SUPPORT_FROM is set but email:support is not in OUTBOX_CONNECTORS`,
				`OUTBOX_SLACK_OPS_TOKEN is set but slack:ops is not in OUTBOX_CONNECTORS`,
			},
		},
		{
			name: "PaymentValues",
			env: with(db, map[string]string{
				"OUTBOX_CONNECTORS":              "payment:a",
				"OUTBOX_PAYMENT_API_KEY":         "sk_test_1\n",
				"OUTBOX_PAYMENT_API_BASE":        "api.stripe.com",
				"OUTBOX_PAYMENT_TIMEOUT":         "0s",
				"OUTBOX_PAYMENT_RATE":            "-1",
				"OUTBOX_PAYMENT_CONCURRENCY":     "many",
				"OUTBOX_PAYMENT_A_API_KEY":       "sk_a",
				"OUTBOX_PAYMENT_A_API_BASE":      "https://user:pw@stripe.example.com:x/",
				"OUTBOX_PAYMENT_A_TIMEOUT":       "45s",
				"OUTBOX_PAYMENT_A_CONCURRENCY":   "-3",
				"OUTBOX_PAYMENT_A_GUARANTEE":     "forwarded",
				"OUTBOX_PAYMENT_A_ON_AMBIGUOUS":  "hold",
				"OUTBOX_PAYMENT_A_RATE":          "Inf",
				"OUTBOX_PAYMENT_NOT_A_VARIABLE_": "x",
			}),
			want: []string{
				`OUTBOX_PAYMENT_CONCURRENCY must be a whole number, got "many"`,
				`OUTBOX_PAYMENT_API_KEY must not contain spaces or newlines`,
				`OUTBOX_PAYMENT_API_BASE must be an absolute http or https URL, got "xxxxx"`,
				`OUTBOX_PAYMENT_TIMEOUT must be positive, got 0s`,
				`OUTBOX_PAYMENT_RATE must be requests per second, 0 for no limit, got -1`,
				`OUTBOX_PAYMENT_A_API_BASE is not a valid URL: the reason is not shown, as it could quote the password; a user name or password with '/', '?', '#' or '@' in it must be percent-encoded`,
				`OUTBOX_PAYMENT_A_RATE must be requests per second, 0 for no limit, got +Inf`,
				`OUTBOX_PAYMENT_A_CONCURRENCY must not be negative (0 means OUTBOX_CONCURRENCY), got -3`,
				`OUTBOX_PAYMENT_A_TIMEOUT (45s) must be at least 1s shorter than OUTBOX_LEASE (30s), or a slow attempt outlives its lease and another relay sends the row again`,
			},
		},
		{
			name: "EmailValues",
			env: with(db, map[string]string{
				"OUTBOX_CONNECTORS":             "email:b",
				"OUTBOX_SMTP_ADDR":              "smtp.example.com",
				"OUTBOX_SMTP_PASSWORD":          "hunter2",
				"OUTBOX_SMTP_TLS":               "starttls",
				"OUTBOX_SMTP_TIMEOUT":           "soon",
				"OUTBOX_EMAIL_FROM":             "not an address",
				"OUTBOX_EMAIL_RATE":             "NaN",
				"OUTBOX_EMAIL_CONCURRENCY":      "-1",
				"OUTBOX_EMAIL_ON_AMBIGUOUS":     "panic",
				"OUTBOX_SMTP_B_ADDR":            ":25",
				"OUTBOX_SMTP_B_USERNAME":        "user",
				"OUTBOX_SMTP_B_TIMEOUT":         "1m",
				"OUTBOX_EMAIL_B_FROM":           "b@example.com",
				"OUTBOX_EMAIL_B_ON_AMBIGUOUS":   "HOLD",
				"OUTBOX_EMAIL_B_GUARANTEE":      "enforced",
				"OUTBOX_SMTP_B_TLS":             "Mandatory",
				"OUTBOX_EMAIL_B_UNKNOWN_THING_": "x",
			}),
			want: []string{
				`OUTBOX_SMTP_TIMEOUT must be a duration such as 500ms, 30s or 1h30m, got "soon"`,
				`OUTBOX_SMTP_ADDR must be host:port, such as smtp.example.com:587, got "smtp.example.com"`,
				`OUTBOX_SMTP_PASSWORD is set but OUTBOX_SMTP_USERNAME is not: SMTP authentication needs a user name`,
				`OUTBOX_SMTP_TLS must be opportunistic, mandatory, none or implicit, got "starttls"`,
				`OUTBOX_EMAIL_FROM must be an email address such as outbox@example.com or "Outbox <outbox@example.com>", got "not an address"`,
				`OUTBOX_EMAIL_RATE must be requests per second, 0 for no limit, got NaN`,
				`OUTBOX_EMAIL_CONCURRENCY must not be negative (0 means OUTBOX_CONCURRENCY), got -1`,
				`OUTBOX_EMAIL_ON_AMBIGUOUS must be retry or hold, got "panic"`,
				`OUTBOX_SMTP_B_ADDR must be host:port, such as smtp.example.com:587, got ":25"`,
				`OUTBOX_SMTP_B_TIMEOUT (1m0s) must be at least 1s shorter than OUTBOX_LEASE (30s), or a slow attempt outlives its lease and another relay sends the row again`,
			},
		},
		{
			name: "SlackValues",
			env: with(db, map[string]string{
				"OUTBOX_CONNECTORS":            "slack:c",
				"OUTBOX_SLACK_TOKEN":           "xoxb- 1",
				"OUTBOX_SLACK_API_BASE":        "ftp://slack.com/api/",
				"OUTBOX_SLACK_TIMEOUT":         "-1s",
				"OUTBOX_SLACK_HISTORY_LIMIT":   "0",
				"OUTBOX_SLACK_RATE":            "x",
				"OUTBOX_SLACK_C_TOKEN":         "xoxb-c",
				"OUTBOX_SLACK_C_HISTORY_LIMIT": "1000",
				"OUTBOX_SLACK_C_CONCURRENCY":   "1.5",
				"OUTBOX_SLACK_C_TIMEOUT":       "30s",
				"OUTBOX_SLACK_C_ON_AMBIGUOUS":  "hold",
				"OUTBOX_SLACK_C_API_BASE":      "https://slack.example.com/api/",
			}),
			want: []string{
				`OUTBOX_SLACK_RATE must be a number, got "x"`,
				`OUTBOX_SLACK_TOKEN must not contain spaces or newlines`,
				`OUTBOX_SLACK_API_BASE must be an absolute http or https URL, got "ftp://slack.com/xxxxx"`,
				`OUTBOX_SLACK_TIMEOUT must be positive, got -1s`,
				`OUTBOX_SLACK_HISTORY_LIMIT must be from 1 to 999, got 0`,
				`OUTBOX_SLACK_C_CONCURRENCY must be a whole number, got "1.5"`,
				`OUTBOX_SLACK_C_HISTORY_LIMIT must be from 1 to 999, got 1000`,
				`OUTBOX_SLACK_C_TIMEOUT (30s) must be at least 1s shorter than OUTBOX_LEASE (30s), or a slow attempt outlives its lease and another relay sends the row again`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			cfg, err := Load(environ(tt.env))
			require.Nil(t, cfg)
			require.Equal(t, tt.want, problemLines(t, err))
		})
	}
}

func TestKindSecretsRedacted(t *testing.T) {
	t.Parallel()

	secrets := []string{"sk_live_S3CRETKEY", "rk_live_EUKEY", "SMTPPASSW0RD", "SUPPORTPASSW0RD", "xoxb-T0KEN", "xoxb-OPST0KEN"}
	cfg, err := Load(environ(with(db, map[string]string{
		"OUTBOX_CONNECTORS":            "payment:eu,email:support,slack:ops",
		"OUTBOX_PAYMENT_API_KEY":       secrets[0],
		"OUTBOX_PAYMENT_EU_API_KEY":    secrets[1],
		"OUTBOX_SMTP_ADDR":             "smtp.example.com:587",
		"OUTBOX_SMTP_USERNAME":         "mailer",
		"OUTBOX_SMTP_PASSWORD":         secrets[2],
		"OUTBOX_EMAIL_FROM":            "outbox@example.com",
		"OUTBOX_SMTP_SUPPORT_ADDR":     "smtp.example.com:587",
		"OUTBOX_SMTP_SUPPORT_USERNAME": "support",
		"OUTBOX_SMTP_SUPPORT_PASSWORD": secrets[3],
		"OUTBOX_EMAIL_SUPPORT_FROM":    "support@example.com",
		"OUTBOX_SLACK_TOKEN":           secrets[4],
		"OUTBOX_SLACK_OPS_TOKEN":       secrets[5],
	})))
	require.NoError(t, err)

	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("starting", "config", cfg)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("starting", "config", cfg)
	printed := map[string]string{
		"slog text": text.String(),
		"slog json": js.String(),
		"%v":        fmt.Sprintf("%v", cfg),
		"%+v":       fmt.Sprintf("%+v", *cfg),
		"%#v":       fmt.Sprintf("%#v", cfg),
		"payments":  fmt.Sprintf("%v %+v %#v", cfg.Payments, cfg.Payments, cfg.Payments),
		"emails":    fmt.Sprintf("%v %+v %#v", cfg.Emails, cfg.Emails, cfg.Emails),
		"slacks":    fmt.Sprintf("%v %+v %#v", cfg.Slacks, cfg.Slacks, cfg.Slacks),
		"smtp":      fmt.Sprintf("%v %+v %#v", cfg.Emails[0].SMTP, cfg.Emails[0].SMTP, cfg.Emails[0].SMTP),
	}
	for how, out := range printed {
		for _, secret := range secrets {
			require.NotContains(t, out, secret, how)
		}
		require.Contains(t, out, "xxxxx", how)
	}
	require.Contains(t, text.String(), "config.payment.api_key=xxxxx")
	require.Contains(t, text.String(), "config.payment:eu.api_base=https://api.stripe.com")
	require.Contains(t, text.String(), "config.email:support.password=xxxxx")
	require.Contains(t, text.String(), "config.email:support.from=support@example.com")
	require.Contains(t, text.String(), "config.slack:ops.token=xxxxx")
	require.Contains(t, js.String(), `"slack":{"token":"xxxxx"`)

	// Problems never quote a secret either.
	_, err = Load(environ(with(db, map[string]string{
		"OUTBOX_PAYMENT_API_KEY": "sk_live S3CRET",
		"OUTBOX_SLACK_TOKEN":     "xoxb-T0KEN\n",
		"OUTBOX_SMTP_ADDR":       "smtp.example.com:587",
		"OUTBOX_SMTP_PASSWORD":   "SMTPPASSW0RD",
		"OUTBOX_EMAIL_FROM":      "outbox@example.com",
	})))
	require.Error(t, err)
	for _, secret := range []string{"S3CRET", "T0KEN", "SMTPPASSW0RD"} {
		require.False(t, strings.Contains(err.Error(), secret), "%q in %s", secret, err)
	}
}

func TestLoadEmailResend(t *testing.T) {
	t.Parallel()

	cfg, err := Load(environ(with(db, map[string]string{
		"OUTBOX_EMAIL_API_KEY":          "re_default",
		"OUTBOX_EMAIL_FROM":             "Outbox <outbox@example.com>",
		"OUTBOX_CONNECTORS":             "email:news,email:smtp2",
		"OUTBOX_EMAIL_NEWS_TRANSPORT":   "Resend",
		"OUTBOX_EMAIL_NEWS_API_KEY":     "re_news",
		"OUTBOX_EMAIL_NEWS_API_BASE":    "http://127.0.0.1:9999",
		"OUTBOX_EMAIL_NEWS_API_TIMEOUT": "5s",
		"OUTBOX_EMAIL_NEWS_FROM":        "news@example.com",
		"OUTBOX_SMTP_SMTP2_ADDR":        "mail:25",
		"OUTBOX_EMAIL_SMTP2_FROM":       "b@example.com",
	})))
	require.NoError(t, err)
	require.Equal(t, []string{"email", "email:news", "email:smtp2"}, cfg.Instances())
	def, news, smtp2 := cfg.Emails[0], cfg.Emails[1], cfg.Emails[2]
	require.Equal(t, EmailTransportResend, def.Transport)
	require.Equal(t, ResendAPI{APIKey: "re_default", APIBase: "https://api.resend.com", APITimeout: 20 * time.Second}, def.ResendAPI)
	require.Equal(t, EmailTransportResend, news.Transport)
	require.Equal(t, ResendAPI{APIKey: "re_news", APIBase: "http://127.0.0.1:9999", APITimeout: 5 * time.Second}, news.ResendAPI)
	require.Equal(t, 5*time.Second, news.timeout())
	require.Equal(t, "OUTBOX_EMAIL_NEWS_API_TIMEOUT", news.timeoutVar())
	require.Equal(t, EmailTransportSMTP, smtp2.Transport)
	require.Equal(t, "OUTBOX_SMTP_SMTP2_TIMEOUT", smtp2.timeoutVar())

	for _, out := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v %#v", cfg.Emails, cfg.Emails), fmt.Sprintf("%v %+v %#v", def.ResendAPI, def.ResendAPI, def.ResendAPI)} {
		require.NotContains(t, out, "re_default")
		require.NotContains(t, out, "re_news")
	}
	var text bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("starting", "config", cfg)
	require.Contains(t, text.String(), "config.email.transport=resend")
	require.Contains(t, text.String(), "config.email.api_key=xxxxx")
	require.NotContains(t, text.String(), "re_default")
}

func TestLoadEmailTransportProblems(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{
			name: "BothWithoutTransport",
			env: with(db, map[string]string{
				"OUTBOX_SMTP_ADDR": "smtp.example.com:587", "OUTBOX_EMAIL_API_KEY": "re_x", "OUTBOX_EMAIL_FROM": "a@example.com",
			}),
			want: []string{`OUTBOX_SMTP_ADDR and OUTBOX_EMAIL_API_KEY are both set: set OUTBOX_EMAIL_TRANSPORT to smtp or resend`},
		},
		{
			name: "BothWithTransport",
			env: with(db, map[string]string{
				"OUTBOX_SMTP_ADDR": "smtp.example.com:587", "OUTBOX_EMAIL_API_KEY": "re_x", "OUTBOX_EMAIL_FROM": "a@example.com",
				"OUTBOX_EMAIL_TRANSPORT": "resend",
			}),
			want: []string{`OUTBOX_SMTP_ADDR is set but email sends through resend, which does not use it`},
		},
		{
			name: "ResendWithoutKey",
			env: with(db, map[string]string{
				"OUTBOX_SMTP_ADDR": "smtp.example.com:587", "OUTBOX_EMAIL_FROM": "a@example.com", "OUTBOX_EMAIL_TRANSPORT": "resend",
			}),
			want: []string{
				`OUTBOX_EMAIL_API_KEY is required for email, which sends through resend`,
				`OUTBOX_SMTP_ADDR is set but email sends through resend, which does not use it`,
			},
		},
		{
			name: "NamedSMTPWithoutAddr",
			env: with(db, map[string]string{
				"OUTBOX_CONNECTORS": "email:b", "OUTBOX_EMAIL_B_TRANSPORT": "smtp", "OUTBOX_EMAIL_B_FROM": "a@example.com",
			}),
			want: []string{`OUTBOX_SMTP_B_ADDR is required for email:b, which sends through smtp`},
		},
		{
			name: "SMTPWithAPIVariables",
			env: with(db, map[string]string{
				"OUTBOX_SMTP_ADDR": "smtp.example.com:587", "OUTBOX_EMAIL_FROM": "a@example.com",
				"OUTBOX_EMAIL_API_BASE": "http://127.0.0.1:1", "OUTBOX_EMAIL_API_TIMEOUT": "20s",
			}),
			want: []string{`OUTBOX_EMAIL_API_BASE is set but email sends through smtp, which does not use it`},
		},
		{
			name: "BadValues",
			env: with(db, map[string]string{
				"OUTBOX_CONNECTORS":          "email:b",
				"OUTBOX_EMAIL_API_KEY":       "re_ x",
				"OUTBOX_EMAIL_API_BASE":      "ftp://api.resend.com",
				"OUTBOX_EMAIL_API_TIMEOUT":   "0s",
				"OUTBOX_EMAIL_FROM":          "a@example.com",
				"OUTBOX_EMAIL_B_TRANSPORT":   "sendgrid",
				"OUTBOX_EMAIL_B_FROM":        "b@example.com",
				"OUTBOX_EMAIL_B_API_TIMEOUT": "1m",
			}),
			want: []string{
				`OUTBOX_EMAIL_API_KEY must not contain spaces or newlines`,
				`OUTBOX_EMAIL_API_BASE must be an absolute http or https URL, got "ftp://api.resend.com"`,
				`OUTBOX_EMAIL_API_TIMEOUT must be positive, got 0s`,
				`OUTBOX_EMAIL_B_TRANSPORT must be smtp or resend, got "sendgrid"`,
			},
		},
		{
			name: "UnlistedNamedResend",
			env: with(db, map[string]string{
				"OUTBOX_EMAIL_API_KEY": "re_x", "OUTBOX_EMAIL_FROM": "a@example.com",
				"OUTBOX_EMAIL_NEWS_API_KEY": "re_y",
			}),
			want: []string{`OUTBOX_EMAIL_NEWS_API_KEY is set but email:news is not in OUTBOX_CONNECTORS`},
		},
		{
			name: "ResendTimeoutOutlivesLease",
			env: with(db, map[string]string{
				"OUTBOX_EMAIL_API_KEY": "re_x", "OUTBOX_EMAIL_FROM": "a@example.com", "OUTBOX_EMAIL_API_TIMEOUT": "30s",
			}),
			want: []string{`OUTBOX_EMAIL_API_TIMEOUT (30s) must be at least 1s shorter than OUTBOX_LEASE (30s), or a slow attempt outlives its lease and another relay sends the row again`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := Load(environ(tt.env))
			require.Nil(t, cfg)
			require.Equal(t, tt.want, problemLines(t, err))
			require.NotContains(t, err.Error(), "re_x")
		})
	}
}

// TestSMTPAddrPasswordNeverInProblems: many tools take the SMTP server as a URL with its
// credentials (smtp://user:pass@host:587). OUTBOX_SMTP_ADDR is host:port, and the
// problem that says so quoted the value whole, password included.
func TestSMTPAddrPasswordNeverInProblems(t *testing.T) {
	t.Parallel()

	for _, addr := range []string{
		"smtp://mailer:SMTPPASSW0RD@smtp.example.com:587",
		"mailer:SMTPPASSW0RD@smtp.example.com:587",
		"smtps://mailer:SMTPPASSW0RD@smtp.example.com",
		// host:port in form, but no host has an "@": the start-up line would print it.
		"SMTPPASSW0RD@smtp.example.com:587",
	} {
		_, err := Load(environ(with(db, map[string]string{
			"OUTBOX_SMTP_ADDR":  addr,
			"OUTBOX_EMAIL_FROM": "outbox@example.com",
		})))
		require.Equal(t, []string{
			`OUTBOX_SMTP_ADDR must be host:port, such as smtp.example.com:587, without a user name or password ` +
				`(set OUTBOX_SMTP_USERNAME and OUTBOX_SMTP_PASSWORD), got "xxxxx` + addr[strings.LastIndex(addr, "@"):] + `"`,
		}, problemLines(t, err), addr)
	}
}

// TestLoadRefusesWhatConnectorsRefuse: a URL the connector's New refuses is a problem
// of Load too, reported with every other one and naming its variable. Load used to
// accept an API base with a query or fragment, a Slack API base with credentials and a
// URL without a host name ("http://:8080/"); serve then stopped on the first instance's
// connector error ("payment (OUTBOX_PAYMENT_*): payment config: APIBase: ..."), alone.
func TestLoadRefusesWhatConnectorsRefuse(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(with(db, map[string]string{
		"OUTBOX_LEASE":            "x",
		"OUTBOX_WEBHOOK_URL":      "http://:8080/hook",
		"OUTBOX_PAYMENT_API_KEY":  "sk_test_123",
		"OUTBOX_PAYMENT_API_BASE": "http://127.0.0.1:12111/?tok=abc",
		"OUTBOX_EMAIL_API_KEY":    "re_123",
		"OUTBOX_EMAIL_FROM":       "outbox@example.com",
		"OUTBOX_EMAIL_API_BASE":   "https://api.resend.com/#v1",
		"OUTBOX_SLACK_TOKEN":      "xoxb-123",
		"OUTBOX_SLACK_API_BASE":   "https://user:S3CRET@slack.com/api/",
	})))
	require.Equal(t, []string{
		`OUTBOX_LEASE must be a duration such as 500ms, 30s or 1h30m, got "x"`,
		`OUTBOX_WEBHOOK_URL must be an absolute http or https URL, got "http://:8080/xxxxx"`,
		`OUTBOX_PAYMENT_API_BASE must not have a query or fragment, got "http://127.0.0.1:12111/xxxxx"`,
		`OUTBOX_EMAIL_API_BASE must not have a query or fragment, got "https://api.resend.com"`,
		`OUTBOX_SLACK_API_BASE must not carry a user name or password: the API key or token authenticates, and they would not be sent`,
	}, problemLines(t, err))
}

// TestLoadRefusesControlCharactersInKeys: an API key or token goes into a request
// header, where net/http refuses a control character on every attempt (and the Resend
// connector's New refuses it, after Load). A stray one from a file or a paste is a
// problem at start, like a space, and is never quoted.
func TestLoadRefusesControlCharactersInKeys(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(with(db, map[string]string{
		"OUTBOX_CONNECTORS":       "email:re",
		"OUTBOX_PAYMENT_API_KEY":  "sk_test_S3CRET\x00",
		"OUTBOX_SLACK_TOKEN":      "xoxb-T0KEN\x1b",
		"OUTBOX_EMAIL_RE_API_KEY": "re_K3Y\x7f",
		"OUTBOX_EMAIL_RE_FROM":    "outbox@example.com",
	})))
	require.Equal(t, []string{
		`OUTBOX_PAYMENT_API_KEY must not contain control characters`,
		`OUTBOX_EMAIL_RE_API_KEY must not contain control characters`,
		`OUTBOX_SLACK_TOKEN must not contain control characters`,
	}, problemLines(t, err))
}

// TestLoadRefusesControlCharactersInSMTPCredentials: a user name or password read from
// a file or a Kubernetes secret often ends with a newline, which Load kept: AUTH sent
// it, the server refused it for every message, and serve's start-up line broke at the
// user name. A space may belong to a password, a newline or other control character
// not; it is a problem at start, as in an API key, and never quoted.
func TestLoadRefusesControlCharactersInSMTPCredentials(t *testing.T) {
	t.Parallel()

	_, err := Load(environ(with(db, map[string]string{
		"OUTBOX_SMTP_ADDR":     "smtp.example.com:587",
		"OUTBOX_SMTP_USERNAME": "relay@example.com\n",
		"OUTBOX_SMTP_PASSWORD": "S3CRET\r\n",
		"OUTBOX_EMAIL_FROM":    "outbox@example.com",
	})))
	require.Equal(t, []string{
		`OUTBOX_SMTP_USERNAME must not contain newlines or other control characters`,
		`OUTBOX_SMTP_PASSWORD must not contain newlines or other control characters`,
	}, problemLines(t, err))

	// Spaces inside a password are the server's business.
	_, err = Load(environ(with(db, map[string]string{
		"OUTBOX_SMTP_ADDR":     "smtp.example.com:587",
		"OUTBOX_SMTP_USERNAME": "relay@example.com",
		"OUTBOX_SMTP_PASSWORD": "correct horse battery staple",
		"OUTBOX_EMAIL_FROM":    "outbox@example.com",
	})))
	require.NoError(t, err)
}
