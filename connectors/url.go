package connectors

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// ParseHTTPURL checks a configured target: an absolute http or https URL with a host,
// without white space at either end. Errors start with field ("URL: has no host") and
// never quote the URL, which may carry a password.
func ParseHTTPURL(field, raw string) (*url.URL, error) {
	if strings.TrimSpace(raw) != raw {
		// A stray one from an env file: url.Parse keeps a space at the end of the path,
		// sent as %20 (and an API base's path goes in front of every request's), so the
		// receiver would answer 404 to every row; errors show only scheme and host.
		return nil, fmt.Errorf("%s: begins or ends with white space, which would be sent as part of the URL", field)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: does not parse: %s", field, ParseReason(raw, err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%s: scheme must be http or https, not %q", field, u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("%s: has no host", field)
	}
	if problem := PortProblem(u); problem != "" {
		return nil, fmt.Errorf("%s: %s", field, problem)
	}
	return u, nil
}

// PortProblem says why u's port cannot be connected to, or returns "" when it can or
// u has none (the scheme's default). url.Parse takes any digits for a port: one out of
// range would fail every attempt as a network error, retried until the row is dead.
func PortProblem(u *url.URL) string {
	p := u.Port()
	if p == "" {
		return ""
	}
	if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
		return "port " + p + " is not between 1 and 65535"
	}
	return ""
}

// ParseReason is url.Parse's reason for refusing raw, without the URL, which its error
// quotes whole, password included. When raw may hold a user name or password (it has an
// '@'), not even the reason is given: url.Parse takes a password holding '/', '?' or '#'
// for the end of the host, and quotes the password's start as an invalid port.
func ParseReason(raw string, err error) string {
	if strings.Contains(raw, "@") {
		return "the reason is not shown, as it could quote the password; a user name or password with '/', '?', '#' or '@' in it must be percent-encoded"
	}
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	return err.Error()
}

// ParseAPIBase is [ParseHTTPURL] for the root of an API, which takes no query or
// fragment (request paths are appended to it), and no user name or password: the
// connector's API key or token authenticates (the payment and Resend connectors send it
// in the Authorization header, which net/http then leaves as it is, and Slack's goes in
// the form), so credentials there would be taken and never sent, and a proxy that
// wanted them would refuse every row.
func ParseAPIBase(field, raw string) (*url.URL, error) {
	u, err := ParseHTTPURL(field, raw)
	if err != nil {
		return nil, err
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%s: must not have a query or fragment", field)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%s: %s", field, APIBaseCredentialsProblem)
	}
	return u, nil
}

// APIBaseCredentialsProblem is why an API base with a user name or password is refused.
const APIBaseCredentialsProblem = "must not carry a user name or password: the API key or token authenticates, and they would not be sent"

// RedactURL shows raw without its password, for logs and errors, or "(invalid URL)"
// when it does not parse.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid URL)"
	}
	return u.Redacted()
}

// RedactEndpoint shows only a URL's scheme and host, with "/xxxxx" when it has more:
// webhook URLs often carry a token in the user info, the path or the query, and what a
// connector's errors show reaches last_error, which the intent API shows to agents. It
// returns "" for "" and "xxxxx" for what does not parse as a URL with a host.
func RedactEndpoint(raw string) string {
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

// redacted stands in for a secret, as pgx and net/url write it.
const redacted = "xxxxx"
