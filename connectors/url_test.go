package connectors_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

func TestParseURLs(t *testing.T) {
	t.Parallel()
	u, err := connectors.ParseAPIBase("APIBase", "https://api.example.com/v1")
	require.NoError(t, err)
	require.Equal(t, "api.example.com", u.Host)

	for raw, want := range map[string]string{
		"ftp://x":               `APIBase: scheme must be http or https, not "ftp"`,
		"api.example.com":       `APIBase: scheme must be http or https, not ""`,
		"http:///path":          "APIBase: has no host",
		"http://a b":            "APIBase: does not parse",
		"https://x/?q=1":        "APIBase: must not have a query or fragment",
		"http://u:s3cret@a b/x": "APIBase: does not parse",
		// A password with '/', '?' or '#' ends the host early for url.Parse, whose reason
		// then quotes the password's start as a port.
		"https://hook:s3cret/x+Q@example.com/hook":  "APIBase: does not parse: the reason is not shown",
		"https://hook:s3cret?rest@example.com/hook": "APIBase: does not parse: the reason is not shown",
		"https://hook:s3cret#rest@example.com/hook": "APIBase: does not parse: the reason is not shown",
	} {
		_, err := connectors.ParseAPIBase("APIBase", raw)
		require.ErrorContains(t, err, want, raw)
		require.NotContains(t, err.Error(), "s3cret", "errors never quote a password")
	}
	_, err = connectors.ParseHTTPURL("URL", "https://x/?q=1")
	require.NoError(t, err, "a target URL may have a query")
}

// A port url.Parse takes but no connection can use (0, or past 65535) is refused with
// the configuration, rather than failing every attempt as a network error, retried for
// days until each row is dead.
func TestParseHTTPURLRefusesPortOutOfRange(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"http://127.0.0.1:99999/hook", "https://hooks.example.com:0/in", "http://u:s3cret@example.com:65536/", "http://[::1]:123456789012345678901234567890/"} {
		_, err := connectors.ParseHTTPURL("URL", raw)
		require.ErrorContains(t, err, "URL: port ", raw)
		require.ErrorContains(t, err, " is not between 1 and 65535", raw)
		require.NotContains(t, err.Error(), "s3cret")
	}
	for _, raw := range []string{"http://127.0.0.1:65535/hook", "https://example.com:1/", "https://example.com:/", "https://example.com/"} {
		_, err := connectors.ParseHTTPURL("URL", raw)
		require.NoError(t, err, raw)
	}
}

// White space at either end of a configured URL (a stray one from an env file) is kept by
// url.Parse in the path, sent as %20, and an API base's path goes in front of every
// request's: the receiver would answer 404 to every row. Every connector's URL and API
// base (webhook, payment, Slack, Resend) is checked here, so each refuses it.
func TestParseHTTPURLRefusesWhiteSpaceAtEitherEnd(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"https://slack.com/api ", " https://api.resend.com", "https://u:s3cret@example.com/\n", "\thttps://x/"} {
		_, err := connectors.ParseHTTPURL("URL", raw)
		require.ErrorContains(t, err, "URL: begins or ends with white space", raw)
		require.NotContains(t, err.Error(), "s3cret")
		_, err = connectors.ParseAPIBase("APIBase", raw)
		require.ErrorContains(t, err, "APIBase: begins or ends with white space", raw)
	}
}
