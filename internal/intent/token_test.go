package intent_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
)

func TestAllows(t *testing.T) {
	t.Parallel()
	tok := &intent.Token{Connectors: []string{"webhook:*", "payment:eu"}}
	for conn, want := range map[string]bool{
		"webhook": true, "webhook:crm": true, "payment:eu": true,
		"payment": false, "payment:us": false, "slack": false, "": false,
	} {
		require.Equal(t, want, tok.Allows(conn), conn)
	}
	all := &intent.Token{Connectors: []string{"*"}}
	require.True(t, all.Allows("slack:ops"))
	exact := &intent.Token{Connectors: []string{"webhook"}}
	require.False(t, exact.Allows("webhook:crm"))
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	h := strings.Repeat("AB", 32)
	toks, err := intent.ParseTokens(`[{"name":"a","sha256":"` + h + `","connectors":["webhook","slack:*","*"],"admin":true}]`)
	require.NoError(t, err)
	require.Equal(t, []intent.Token{{Name: "a", SHA256: strings.ToLower(h), Connectors: []string{"webhook", "slack:*", "*"}, Admin: true}}, toks)

	toks, err = intent.ParseTokens("  ")
	require.NoError(t, err)
	require.Empty(t, toks)

	_, err = intent.ParseTokens(`[{"name":"a","sha256":"x","connectors":["Bad!"]},{"name":"a","sha256":"` + h + `","connectors":[]},{"sha256":"` + h + `","connectors":["webhook"]}]`)
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{"sha256 must be 64 hex digits", `connector "Bad!" is malformed`, "names must be unique", "connectors is empty", "token 2: name is empty"} {
		require.Contains(t, msg, want)
	}
	// One secret for two tokens would act as the first listed, an admin here.
	_, err = intent.ParseTokens(`[{"name":"ops","sha256":"` + h + `","connectors":["*"],"admin":true},` +
		`{"name":"agent","sha256":"` + strings.ToLower(h) + `","connectors":["webhook"]}]`)
	require.ErrorContains(t, err, `token "agent": sha256 is also token "ops"'s; each token needs its own secret`)
	_, err = intent.ParseTokens(`[{"name":"a","sha256":"` + h + `","connectors":["webhook"],"admn":true}]`)
	require.ErrorContains(t, err, "admn")
	_, err = intent.ParseTokens(`{}`)
	require.Error(t, err)
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	secret, sum, err := intent.NewToken()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(secret, "obx_"))
	got := sha256.Sum256([]byte(secret))
	require.Equal(t, hex.EncodeToString(got[:]), sum)
	other, _, err := intent.NewToken()
	require.NoError(t, err)
	require.NotEqual(t, secret, other)

	p := &intent.Policy{Tokens: []intent.Token{
		{Name: "x", SHA256: strings.Repeat("0", 64), Connectors: []string{"*"}},
		{Name: "me", SHA256: sum, Connectors: []string{"webhook"}},
	}}
	tok, err := p.Authenticate(secret)
	require.NoError(t, err)
	require.Equal(t, "me", tok.Name)
	for _, bad := range []string{"", other, sum} {
		_, err = p.Authenticate(bad)
		require.ErrorIs(t, err, intent.ErrUnauthorized)
		if bad != "" {
			require.NotContains(t, err.Error(), bad)
		}
	}
}

// A connector of a kind the outbox does not have (a typo such as "webhok") would leave
// the token refused (403) on every request for the connector meant, with nothing said at
// start: ParseTokens refuses it, as OUTBOX_APPROVAL_REQUIRED's check does such a name.
func TestParseTokensRefusesUnknownKinds(t *testing.T) {
	t.Parallel()
	h := strings.Repeat("ab", 32)
	for _, c := range []string{"webhok", "fax:*", "fax:crm"} {
		_, err := intent.ParseTokens(`[{"name":"agent","sha256":"` + h + `","connectors":["webhook","` + c + `"]}]`)
		require.ErrorContains(t, err, `token "agent": connector "`+c+`" is of no known kind`, c)
	}
	toks, err := intent.ParseTokens(`[{"name":"agent","sha256":"` + h + `","connectors":["webhook","email:*","slack:ops","payment","*"]}]`)
	require.NoError(t, err)
	require.Len(t, toks, 1)
}

// encoding/json lets the last of a field's names win, matched without regard to case
// (with Unicode folding: "ſ" is an "s"), so an entry could read "admin": false, or a
// narrow "connectors", where a reviewer looks, and grant admin, or every connector, further
// on. A field given twice is refused; one written in another case still reads as before.
func TestParseTokensRefusesAFieldGivenTwice(t *testing.T) {
	t.Parallel()
	h := strings.Repeat("ab", 32)
	for _, fields := range []string{
		`"connectors":["webhook"],"admin":false,"admin":true`,
		`"connectors":["webhook"],"admin":false,"Admin":true`,
		`"connectors":["webhook"],"connectorſ":["*"]`,
		`"connectors":["webhook"],"CONNECTORS":["*"],"admin":false`,
	} {
		_, err := intent.ParseTokens(`[{"name":"agent","sha256":"` + h + `",` + fields + `}]`)
		require.ErrorContains(t, err, `token "agent": field`, fields)
		require.ErrorContains(t, err, "is given more than once", fields)
	}
	_, err := intent.ParseTokens(`[{"name":"agent","sha256":"` + h + `","name":"ops","connectors":["webhook"]}]`)
	require.ErrorContains(t, err, "is given more than once")

	toks, err := intent.ParseTokens(`[{"Name":"agent","SHA256":"` + h + `","Connectors":["webhook"],"Admin":false}]`)
	require.NoError(t, err)
	require.Equal(t, []intent.Token{{Name: "agent", SHA256: h, Connectors: []string{"webhook"}}}, toks)
}

// TestParseTokensRefusesANulInAName: a token's name is each of its intents' created_by
// and its decisions' actor, text that PostgreSQL cannot hold with a NUL in it. Such a
// name ("agent\u0000" in OUTBOX_API_TOKENS) was taken at start, and then every intent
// the token proposed was answered 422, "invalid message: created_by is not valid UTF-8
// or contains a NUL character", though the intent was valid. It is refused at start.
func TestParseTokensRefusesANulInAName(t *testing.T) {
	t.Parallel()
	h := strings.Repeat("ab", 32)
	for _, name := range []string{`agent\u0000`, `a\u0000b`, `\u0000`} {
		_, err := intent.ParseTokens(`[{"name":"` + name + `","sha256":"` + h + `","connectors":["webhook"]}]`)
		require.ErrorContains(t, err, "name must not contain a NUL character", name)
	}
	// Other control characters are text PostgreSQL holds; outboxd escapes them where it shows names.
	_, err := intent.ParseTokens(`[{"name":"a\nb","sha256":"` + h + `","connectors":["webhook"]}]`)
	require.NoError(t, err)
}
