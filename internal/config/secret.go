package config

import (
	"log/slog"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// redacted stands in for a secret, as pgx and net/url write it.
const redacted = "xxxxx"

// Secret is a configuration value that must not be printed, such as a signing key.
// fmt, log/slog and encoding/json show it as xxxxx, or as "" when it is empty, so a
// reader can tell whether it is set. [Secret.Reveal] returns the value.
type Secret string

// Reveal returns the secret itself, for the code that uses it.
func (s Secret) Reveal() string { return string(s) }

// String returns xxxxx, or "" when the secret is empty.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString is String, so that %#v redacts too.
func (s Secret) GoString() string { return s.String() }

// LogValue is String, so that log/slog redacts.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText is String, so that encoding/json redacts.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// RedactDSN returns a PostgreSQL DSN with its passwords replaced by xxxxx, in either
// form pgx accepts: a URL (the user info, and password or sslpassword in the query) or
// keyword/value pairs (password=..., sslpassword=..., quoted or not). Where a password
// ends is not always plain (pgx takes "postgres://u:pa#ss@host/db" to have the password
// "pa#ss", where a URL parser sees a fragment), so it masks more rather than less: in a
// URL, everything between the user name and the last "@"; in keyword/value pairs pgx
// cannot parse, everything after the first password keyword.
func RedactDSN(dsn string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return maskUserInfo(redactDSNURL(dsn))
	}
	out := kvPassword.ReplaceAllString(dsn, "${1}"+redacted)
	if _, err := pgconn.ParseConfig(dsn); err != nil && dsn != "" {
		if loc := kvPasswordKey.FindStringIndex(out); loc != nil {
			out = out[:loc[1]] + redacted
		}
		// Neither form pgx takes, perhaps a URL with a scheme it does not read as one
		// (" postgres://", "POSTGRES://", "jdbc:postgresql://", "postgres:/"): its user
		// info may hold a password, so mask from the first ":" to the last "@".
		out = maskColonToAt(out)
	}
	return out
}

// maskColonToAt masks what lies between the first ":" and the last "@" of s, unless it
// is masked already.
func maskColonToAt(s string) string {
	colon, at := strings.IndexByte(s, ':'), strings.LastIndexByte(s, '@')
	if colon < 0 || at < colon || s[colon+1:at] == redacted {
		return s
	}
	return s[:colon+1] + redacted + s[at:]
}

// maskUserInfo masks, in a DSN URL, what lies between the first ":" after the scheme and
// the last "@" (the password, with anything in it that looked like the end of the user
// info), unless it is masked already. A ":" after the last "@" belongs to a host.
func maskUserInfo(u string) string {
	scheme, rest, _ := strings.Cut(u, "://")
	colon, at := strings.IndexByte(rest, ':'), strings.LastIndexByte(rest, '@')
	if colon < 0 || at < colon || rest[colon+1:at] == redacted {
		return u
	}
	return scheme + "://" + rest[:colon+1] + redacted + rest[at:]
}

// kvPasswordKey finds where a keyword/value DSN's password may start.
var kvPasswordKey = regexp.MustCompile(`(?i)\b(?:ssl)?password\s*=\s*`)

// kvPassword matches a password pair of a keyword/value DSN, as pgconn parses them:
// the value is single-quoted with backslash escapes, or runs to the next space.
var kvPassword = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:[^\s\\]|\\.)*)`)

// redactDSNURL works on the text rather than a parsed url.URL, because pgx accepts
// URLs that net/url refuses (several hosts), and a DSN that does not parse still has
// to be redacted. When unsure where the user info ends, it masks more.
func redactDSNURL(dsn string) string {
	scheme, rest, _ := strings.Cut(dsn, "://")
	var b strings.Builder
	b.WriteString(scheme + "://")
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		user, _, hasPassword := strings.Cut(authority[:i], ":")
		b.WriteString(user)
		if hasPassword {
			b.WriteString(":" + redacted)
		}
		b.WriteByte('@')
		rest = rest[i+1:]
	}
	path, query, hasQuery := strings.Cut(rest, "?")
	b.WriteString(path)
	if hasQuery {
		pairs := strings.Split(query, "&")
		for i, pair := range pairs {
			k, _, hasValue := strings.Cut(pair, "=")
			key, err := url.QueryUnescape(k)
			if err != nil {
				key = k
			}
			if key = strings.ToLower(key); hasValue && (key == "password" || key == "sslpassword") {
				pairs[i] = k + "=" + redacted
			}
		}
		b.WriteString("?" + strings.Join(pairs, "&"))
	}
	return b.String()
}
