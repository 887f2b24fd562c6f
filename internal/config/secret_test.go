package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSecret(t *testing.T) {
	t.Parallel()

	s := Secret("whsec_s3cret")
	require.Equal(t, "whsec_s3cret", s.Reveal())
	for _, format := range []string{"%v", "%s", "%+v", "%#v", "%q", "%x"} {
		require.NotContains(t, fmt.Sprintf(format, s), "s3cret", format)
	}
	require.Equal(t, "xxxxx", s.String())
	b, err := json.Marshal(struct{ S Secret }{s})
	require.NoError(t, err)
	require.JSONEq(t, `{"S":"xxxxx"}`, string(b))

	// An empty secret shows as empty, so a reader can tell it is unset.
	require.Empty(t, Secret("").String())
}

func TestConfigRedaction(t *testing.T) {
	t.Parallel()

	secrets := []string{"hunter2", "c2VjcmV0LWRlZmF1bHQ", "Y3JtLXMzY3JldC1rZXk", "urlpass", "tok3n", "T0KEN/PATH"}
	tests := []struct {
		name string
		dsn  string
	}{
		{name: "URL", dsn: "postgres://app:hunter2@db.example.com:5432/app?sslmode=disable&pool_max_conns=4"},
		{name: "KeywordValue", dsn: "host=db.example.com user=app password=hunter2 dbname=app"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			cfg, err := Load(environ(map[string]string{
				"OUTBOX_DATABASE_URL":       tt.dsn,
				"OUTBOX_CONNECTORS":         "webhook:crm",
				"OUTBOX_WEBHOOK_URL":        "https://user:urlpass@hooks.example.com/services/T0KEN/PATH?sig=tok3n",
				"OUTBOX_WEBHOOK_SECRET":     "whsec_c2VjcmV0LWRlZmF1bHQ=",
				"OUTBOX_WEBHOOK_CRM_URL":    "https://crm.example.com/in",
				"OUTBOX_WEBHOOK_CRM_SECRET": "whsec_Y3JtLXMzY3JldC1rZXk=",
			}))
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
				"webhooks":  fmt.Sprintf("%v %+v", cfg.Webhooks, cfg.Webhooks),
				"database":  fmt.Sprint(cfg.Database),
			}
			for how, out := range printed {
				for _, secret := range secrets {
					require.NotContains(t, out, secret, how)
				}
				require.Contains(t, out, "xxxxx", how)
			}

			// What is not secret is still there to read.
			require.Contains(t, text.String(), "config.database.url=")
			require.Contains(t, text.String(), "db.example.com")
			require.Contains(t, text.String(), "config.webhook.url=https://hooks.example.com/xxxxx")
			require.Contains(t, text.String(), "config.webhook:crm.secret=xxxxx")
			require.Contains(t, text.String(), "config.engine.lease=30s")
			require.Contains(t, js.String(), `"webhook:crm":{"url":"https://crm.example.com/xxxxx","secret":"xxxxx"`)
		})
	}
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()

	tests := []struct{ dsn, want string }{
		{"postgres://app:hunter2@db/app", "postgres://app:xxxxx@db/app"},
		{"postgresql://app@db/app?sslmode=require", "postgresql://app@db/app?sslmode=require"},
		{"postgres://app:p%40ss@h1:5432,h2:5433/app", "postgres://app:xxxxx@h1:5432,h2:5433/app"},
		{"postgres://app:p@ss@db/app", "postgres://app:xxxxx@db/app"},
		{"postgres://db/app?user=app&password=hunter2&sslpassword=k3y", "postgres://db/app?user=app&password=xxxxx&sslpassword=xxxxx"},
		{"postgres://db/app?pass%77ord=hunter2", "postgres://db/app?pass%77ord=xxxxx"},
		{"postgres://db/app", "postgres://db/app"},
		{"host=db password=hunter2 user=app", "host=db password=xxxxx user=app"},
		{"host=db password = 'hunter 2\\' x' user=app", "host=db password = xxxxx user=app"},
		{"host=db sslpassword=k3y PASSWORD=hunter2", "host=db sslpassword=xxxxx PASSWORD=xxxxx"},
		{"host=db password='unterminated", "host=db password=xxxxx"},
		// pgx reads "#" and "?" in a URL's password as part of it, where net/url would not.
		{"postgres://u:pa#ss@db/app", "postgres://u:xxxxx@db/app"},
		{"postgres://u:p?ass@db/app?sslmode=disable", "postgres://u:xxxxx@db/app?sslmode=disable"},
		{"postgres://u:pa#ss@h1:5432,h2:5433/app", "postgres://u:xxxxx@h1:5432,h2:5433/app"},
		{"postgres://app:p%40ss#word@db/app", "postgres://app:xxxxx@db/app"},
		{"postgres://app:pa/ss@db/app", "postgres://app:xxxxx@db/app"},
		{"postgres://app@db:5432/app", "postgres://app@db:5432/app"},
		// What pgx does not parse is masked to the end of what could hold a password.
		{"host=db password=se cret user=app", "host=db password=xxxxx"},
		{"", ""},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, RedactDSN(tt.dsn), tt.dsn)
	}
}

// A DSN that pgx cannot parse is one clear problem, and its password is not quoted.
func TestLoadDatabaseRejectsWhatPgxCannotParse(t *testing.T) {
	t.Parallel()
	_, err := LoadDatabase(environ(map[string]string{"OUTBOX_DATABASE_URL": "host=db password=se cret"}))
	require.Error(t, err)
	require.Contains(t, err.Error(), "OUTBOX_DATABASE_URL (host=db password=xxxxx) is not a PostgreSQL URL or keyword/value string that pgx accepts: ")
	require.NotContains(t, err.Error(), "cret")
	var cfgErr *Error
	require.ErrorAs(t, err, &cfgErr)
	require.Len(t, cfgErr.Problems, 1)

	db, err := LoadDatabase(environ(map[string]string{"OUTBOX_DATABASE_URL": "postgres://u:pa#ss@db/app?pool_max_conns=4"}))
	require.NoError(t, err)
	require.Equal(t, "postgres://u:xxxxx@db/app?pool_max_conns=4", db.String())
}

// TestDSNURLWithNewline: a DSN read from a file or a Kubernetes secret often ends with a
// newline. pgx drops it from a keyword/value DSN but keeps it in a URL's database name
// (or password), so serve started and then failed to connect to database "app\n"; the
// URL form now refuses it, in one line that never quotes the password.
func TestDSNURLWithNewline(t *testing.T) {
	t.Parallel()

	for _, dsn := range []string{"postgres://u:S3CRET@db/app\n", "postgresql://u:S3CRET\n@db/app", "postgres://u:S3CRET@db/app\r"} {
		_, err := LoadDatabase(environ(map[string]string{"OUTBOX_DATABASE_URL": dsn}))
		require.Equal(t, []string{
			fmt.Sprintf("OUTBOX_DATABASE_URL (%q) must not contain newlines or other control characters, which pgx would keep in the URL's database name, user or password", RedactDSN(dsn)),
		}, problemLines(t, err), "%q", dsn)
		require.NotContains(t, err.Error(), "S3CRET")
	}

	// pgx drops the white space around a keyword/value pair.
	_, err := LoadDatabase(environ(map[string]string{"OUTBOX_DATABASE_URL": "host=db user=u password=S3CRET dbname=app\n"}))
	require.NoError(t, err)
}

// TestInvalidKeywordValueDSNNeverQuotesPasswordWords: in a keyword/value DSN an unquoted
// password ends at its first space, and pgx's reason quotes the word after it when a
// keyword follows ("missing \"=\" after \"cret\""), so the password's second word was
// printed at start by serve, migrate and every command. A word before any password may
// still be quoted.
func TestInvalidKeywordValueDSNNeverQuotesPasswordWords(t *testing.T) {
	t.Parallel()

	for _, dsn := range []string{
		"host=db password=se cret user=app",
		"host=db password=se cret dbname=app sslmode=disable",
		"host=db sslpassword=k3y s3cr3t dbname=app",
		"host=db PASSWORD = se cret user=app",
	} {
		_, err := LoadDatabase(environ(map[string]string{"OUTBOX_DATABASE_URL": dsn}))
		lines := problemLines(t, err)
		require.Len(t, lines, 1, dsn)
		require.Contains(t, lines[0], "a word after password= has no \"=\" after it", dsn)
		require.NotContains(t, lines[0], "cret", dsn)
		require.NotContains(t, lines[0], "s3cr3t", dsn)

		_, err = ParseDSN("--database-url", dsn)
		require.Error(t, err, dsn)
		require.NotContains(t, err.Error(), "cret", dsn)
		require.NotContains(t, err.Error(), "s3cr3t", dsn)
	}

	_, err := LoadDatabase(environ(map[string]string{"OUTBOX_DATABASE_URL": "bogus host=db password=hunter2 user=app"}))
	require.Equal(t, []string{
		`OUTBOX_DATABASE_URL (bogus host=db password=xxxxx) is not a PostgreSQL URL or keyword/value string that pgx accepts: ` +
			`failed to parse as keyword/value (missing "=" after "bogus" in connection info string)`,
	}, problemLines(t, err))
}

// TestConfigShowsTheIntentAPI: serve's "outboxd starting" line showed the database, the
// engine and the connector instances, but not whether the intent API and /mcp were on,
// nor under which tokens: an OUTBOX_API_TOKENS of [] (or a token left out) turned them
// off without a word. The line now says, naming each token, its connectors and whether
// it is admin, never its hash.
func TestConfigShowsTheIntentAPI(t *testing.T) {
	t.Parallel()

	agent := sha256.Sum256([]byte("agent-secret"))
	ops := sha256.Sum256([]byte("ops-secret"))
	cfg, err := Load(environ(with(minimal, map[string]string{
		"OUTBOX_API_TOKENS": `[{"name":"agent","sha256":"` + hex.EncodeToString(agent[:]) + `","connectors":["webhook","slack:*"]},` +
			`{"name":"ops","sha256":"` + hex.EncodeToString(ops[:]) + `","connectors":["*"],"admin":true}]`,
		"OUTBOX_APPROVAL_REQUIRED": "payment,webhook:crm",
	})))
	require.NoError(t, err)
	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("starting", "config", cfg)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("starting", "config", cfg)
	require.Contains(t, text.String(), `config.api.enabled=true config.api.tokens="agent(webhook,slack:*) ops(*;admin)" `+
		`config.api.approval_required=payment,webhook:crm config.api.rate=10 config.api.max_body=1048576`)
	require.Contains(t, js.String(), `"api":{"enabled":true,"tokens":"agent(webhook,slack:*) ops(*;admin)"`)
	for _, out := range []string{text.String(), js.String(), cfg.String()} {
		require.NotContains(t, out, hex.EncodeToString(agent[:]))
		require.NotContains(t, out, hex.EncodeToString(ops[:]))
	}

	off, err := Load(environ(with(minimal, map[string]string{"OUTBOX_API_TOKENS": "[]"})))
	require.NoError(t, err)
	text.Reset()
	slog.New(slog.NewTextHandler(&text, nil)).Info("starting", "config", off)
	require.Contains(t, text.String(), "config.api.enabled=false")
}
