package pgtest

import (
	"net"
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgcluster"
)

// Bouncer starts a PgBouncer in transaction pooling mode in front of the server of dsn
// (a URL, as [URL] gives), stopped when the test ends, and returns dsn with its host and
// port PgBouncer's. It fails the test when PgBouncer is not installed (.ci/run installs
// it), as tests never skip for want of what they test against.
func Bouncer(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err, "the port of %s", u.Redacted())
	b, err := pgcluster.StartBouncer(t.Context(), u.Hostname(), port, u.User.Username())
	require.NoError(t, err)
	t.Cleanup(b.Stop)
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port()))
	return u.String()
}
