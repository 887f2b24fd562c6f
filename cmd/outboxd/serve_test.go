package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/config"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/relay"
)

func TestServeUsageErrors(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		args    []string
		environ []string
		want    []string // lines stderr must contain
		notWant []string // what stderr must not show (secrets)
	}{
		{
			name:    "EveryConfigProblem",
			args:    []string{"serve"},
			environ: []string{"OUTBOX_LEASE=30", "OUTBOX_CONNECTORS=webhook:crm", "OUTBOX_LOG_LEVEL=loud"},
			want: []string{
				"outboxd: invalid configuration:",
				"- OUTBOX_DATABASE_URL is required but not set",
				`- OUTBOX_LOG_LEVEL must be debug, info, warn or error, got "loud"`,
				`- OUTBOX_LEASE must be a duration such as 500ms, 30s or 1h30m, got "30"`,
				"- OUTBOX_WEBHOOK_CRM_URL is required for webhook:crm, which OUTBOX_CONNECTORS names",
				"Run 'outboxd serve --help' for usage.",
			},
		},
		{
			name: "SecretsStayHidden",
			args: []string{"serve"},
			environ: []string{
				"OUTBOX_DATABASE_URL=postgres://app:hunter2@localhost/app",
				"OUTBOX_WEBHOOK_URL=https://example.com/hook",
				"OUTBOX_WEBHOOK_SECRET=not-a-whsec-secret",
				"OUTBOX_WEBHOOK_GUARANTEE=maybe",
			},
			want: []string{
				"- OUTBOX_WEBHOOK_SECRET must be whsec_ followed by base64 (the Standard Webhooks format)",
				`- OUTBOX_WEBHOOK_GUARANTEE must be forwarded or enforced, got "maybe"`,
			},
			notWant: []string{"hunter2", "not-a-whsec-secret"},
		},
		{
			name:    "NoConnector",
			args:    []string{"serve"},
			environ: []string{"OUTBOX_DATABASE_URL=postgres://app@localhost/app"},
			want: []string{
				"outboxd: no connector instance is configured: set OUTBOX_WEBHOOK_URL for the default webhook instance, " +
					"or name instances in OUTBOX_CONNECTORS (webhook:crm reads OUTBOX_WEBHOOK_CRM_URL)",
			},
		},
		{
			name: "BadDSN",
			args: []string{"serve"},
			environ: []string{
				"OUTBOX_DATABASE_URL=postgres://app:hunter2@localhost:notaport/app",
				"OUTBOX_WEBHOOK_URL=https://example.com/hook",
			},
			want:    []string{"- OUTBOX_DATABASE_URL (postgres://app:xxxxx@localhost:notaport/app) is not a PostgreSQL URL or keyword/value string that pgx accepts: invalid port"},
			notWant: []string{"hunter2"},
		},
		{
			name:    "MigrateBadDSN",
			args:    []string{"migrate"},
			environ: []string{"OUTBOX_DATABASE_URL=host=db password=se cret"},
			want:    []string{"- OUTBOX_DATABASE_URL (host=db password=xxxxx) is not a PostgreSQL URL or keyword/value string that pgx accepts: "},
			notWant: []string{"cret"},
		},
		{
			name:    "Arguments",
			args:    []string{"serve", "now"},
			environ: []string{"OUTBOX_DATABASE_URL=postgres://app@localhost/app", "OUTBOX_WEBHOOK_URL=https://example.com/hook"},
			want:    []string{`outboxd: outboxd serve takes no arguments, got "now"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, tt.environ, strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, exitUsage, code, stderr.String())
			lines := strings.Split(stderr.String(), "\n")
			for _, want := range tt.want {
				require.True(t, containsPrefix(lines, want), "stderr lacks %q:\n%s", want, stderr.String())
			}
			for _, secret := range tt.notWant {
				require.NotContains(t, stderr.String(), secret)
			}
			require.Empty(t, stdout.String())
		})
	}
}

// containsPrefix reports whether one of lines starts with prefix.
func containsPrefix(lines []string, prefix string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

func TestServeHelp(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"serve", "--help"}, nil, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "Examples:\n")
	require.Contains(t, stdout.String(), "OUTBOX_WEBHOOK_URL=https://example.com/hooks/outbox")
	require.Contains(t, stdout.String(), "a second signal exits at once")
}

func TestPoolConfig(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name        string
		dsn         string
		concurrency int
		want        int32
	}{
		{"DefaultConcurrency", "postgres://app@localhost/app", 128, 12},
		{"Small", "postgres://app@localhost/app", 16, 8},
		{"Large", "host=localhost user=app", 1024, 68},
		{"SetInURL", "postgres://app@localhost/app?pool_max_conns=3", 1024, 3},
		{"SetInKeywords", "host=localhost user=app pool_max_conns=40", 16, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := poolConfig(tt.dsn, tt.concurrency)
			require.NoError(t, err)
			require.Equal(t, tt.want, cfg.MaxConns)
		})
	}

	_, err := poolConfig("postgres://app@localhost/app?pool_max_conns=none", 128)
	require.ErrorContains(t, err, "cannot parse pool_max_conns")
}

func TestBuildInstances(t *testing.T) {
	t.Parallel()

	cfg, err := config.Load([]string{
		"OUTBOX_DATABASE_URL=postgres://app@localhost/app",
		"OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook",
		"OUTBOX_CONNECTORS=webhook:crm",
		"OUTBOX_WEBHOOK_CRM_URL=http://127.0.0.1:1/crm",
		"OUTBOX_WEBHOOK_CRM_SECRET=whsec_c2VjcmV0LWRlZmF1bHQ=",
		"OUTBOX_WEBHOOK_CRM_GUARANTEE=enforced",
		"OUTBOX_WEBHOOK_CRM_RATE=5",
		"OUTBOX_WEBHOOK_CRM_CONCURRENCY=3",
		"OUTBOX_WEBHOOK_CRM_ON_AMBIGUOUS=hold",
	})
	require.NoError(t, err)

	instances, err := buildInstances(cfg)
	require.NoError(t, err)
	require.Len(t, instances, 2)

	def := instances["webhook"]
	require.Equal(t, connectors.Forwarded, def.Connector.Guarantee())
	require.Equal(t, relay.AmbiguousRetry, def.OnAmbiguous)
	require.Zero(t, def.Rate)
	require.Zero(t, def.Concurrency)

	crm := instances["webhook:crm"]
	require.Equal(t, connectors.Enforced, crm.Connector.Guarantee())
	require.Equal(t, relay.AmbiguousHold, crm.OnAmbiguous)
	require.Equal(t, 5.0, crm.Rate)
	require.Equal(t, 3, crm.Concurrency)
}

// TestMigrateAcceptsPoolSettingsInDSN: the README puts pool settings such as
// pool_max_conns in OUTBOX_DATABASE_URL, which every command reads; migrate must not
// send them to the server as run-time parameters.
func TestMigrateAcceptsPoolSettingsInDSN(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"migrate"}, []string{"OUTBOX_DATABASE_URL=" + withParam(pgtest.URL(t), "pool_max_conns=4")},
		strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "schema already at version")
}

// migrate takes --database-url as the operator commands do: they tell a user of the flag
// whose database has no schema to run outboxd migrate, which refused the flag.
func TestMigrateTakesDatabaseURLFlag(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"migrate", "--database-url", pgtest.URL(t)}, nil, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "schema already at version")

	stdout.Reset()
	stderr.Reset()
	code = run(t.Context(), []string{"migrate", "--database-url", ""}, []string{"OUTBOX_DATABASE_URL=" + pgtest.URL(t)}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitUsage, code, "an empty flag is not taken for none: %s", stderr.String())
}

// TestServeRefusesBadConfigurationAsUsage: configurations that can never work are
// refused at start as usage errors (exit 2, "invalid configuration", one line naming the
// variable), not after the relay or the listener has been built (exit 1).
func TestServeRefusesBadConfigurationAsUsage(t *testing.T) {
	t.Parallel()

	long := strings.Repeat("a", 100) // webhook:aaa… is 108 characters: the table holds 100
	tests := []struct {
		name    string
		environ []string
		want    string
	}{
		{
			name:    "HTTPAddrPortOutOfRange",
			environ: []string{"OUTBOX_HTTP_ADDR=127.0.0.1:99999", "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook"},
			want:    "- OUTBOX_HTTP_ADDR",
		},
		{
			name:    "HTTPAddrPortNotANumber",
			environ: []string{"OUTBOX_HTTP_ADDR=127.0.0.1:eighty", "OUTBOX_WEBHOOK_URL=http://127.0.0.1:1/hook"},
			want:    "- OUTBOX_HTTP_ADDR",
		},
		{
			name: "InstanceNameTooLongForTheTable",
			environ: []string{
				"OUTBOX_CONNECTORS=webhook:" + long,
				"OUTBOX_WEBHOOK_" + strings.ToUpper(long) + "_URL=http://127.0.0.1:1/hook",
			},
			want: `- OUTBOX_CONNECTORS: "webhook:` + long + `"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			environ := append([]string{
				"OUTBOX_DATABASE_URL=postgres://app:hunter2@127.0.0.1:1/app?connect_timeout=1",
			}, tt.environ...)
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), []string{"serve"}, environ, strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, exitUsage, code, stderr.String())
			require.True(t, strings.HasPrefix(stderr.String(), "outboxd: invalid configuration:\n"), stderr.String())
			require.True(t, containsPrefix(strings.Split(stderr.String(), "\n"), tt.want), "stderr lacks %q:\n%s", tt.want, stderr.String())
			require.NotContains(t, stderr.String(), "hunter2")
		})
	}
}

// TestServeWarnsAboutUnknownVariables: a misspelt variable is read by nothing, so serve
// names it in a warning before anything else, even when it then stops for want of a
// connector (OUTBOX_WEBHOK_URL was meant to create one).
func TestServeWarnsAboutUnknownVariables(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"serve"}, []string{
		"OUTBOX_DATABASE_URL=postgres://app@localhost/app",
		"OUTBOX_WEBHOK_URL=https://example.com/hook",
		"OUTBOX_WEBHOOK_SECERT=whsec_c2VjcmV0",
	}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitUsage, code, stderr.String())
	for _, name := range []string{"OUTBOX_WEBHOK_URL", "OUTBOX_WEBHOOK_SECERT"} {
		require.Contains(t, stderr.String(), "level=WARN msg=\"unknown variable ignored: outboxd reads no variable of this name; check its spelling\" variable="+name+"\n")
	}
	require.NotContains(t, stderr.String(), "c2VjcmV0", "a warning names the variable, never its value")
	require.Contains(t, stderr.String(), "outboxd: no connector instance is configured")
}

// TestServeWarnsAboutUnknownVariablesWithProblems: the warnings come with the
// configuration's problems too, which a misspelt variable most often explains: the
// operator who set OUTBOX_WEBHOOK_CRM_ULR reads that OUTBOX_WEBHOOK_CRM_URL is required,
// and that the variable they set is read by nothing.
func TestServeWarnsAboutUnknownVariablesWithProblems(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"serve"}, []string{
		"OUTBOX_DATABASE_URL=postgres://app@localhost/app",
		"OUTBOX_CONNECTORS=webhook:crm",
		"OUTBOX_WEBHOOK_CRM_ULR=https://crm.example.com/hook",
		"OUTBOX_LOG_LEVEL=loud", // the warnings are logged all the same, at the default level
	}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitUsage, code, stderr.String())
	require.Contains(t, stderr.String(), "level=WARN msg=\"unknown variable ignored: outboxd reads no variable of this name; check its spelling\" variable=OUTBOX_WEBHOOK_CRM_ULR\n")
	require.Contains(t, stderr.String(), "\n- OUTBOX_WEBHOOK_CRM_URL is required for webhook:crm, which OUTBOX_CONNECTORS names\n")
	require.NotContains(t, stderr.String(), "crm.example.com", "a warning names the variable, never its value")
}

// TestMigrateNamesTheFlagOfABadDSN: a --database-url that pgx cannot parse was reported
// as OUTBOX_DATABASE_URL, a variable the user may not even have set, sending them to fix
// the wrong value; the operator commands name the flag, and so must migrate.
func TestMigrateNamesTheFlagOfABadDSN(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"migrate", "--database-url", "postgres://app:hunter2@localhost:notaport/app"}, nil,
		strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitUsage, code, stderr.String())
	require.True(t, strings.HasPrefix(stderr.String(),
		"outboxd: --database-url (postgres://app:xxxxx@localhost:notaport/app) is not a PostgreSQL URL or keyword/value string that pgx accepts: invalid port\n"),
		stderr.String())
	require.NotContains(t, stderr.String(), "hunter2")
	require.Empty(t, stdout.String())
}
