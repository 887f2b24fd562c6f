package relay

import (
	"testing"

	"github.com/stretchr/testify/require"

	outboxd "github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// migrate refuses a new installation in a database whose encoding is not UTF8, and
// upgrades one that is there already (an older outboxd's), as the README says; its
// relays must run there too. The relay read the database's clock in pgx's simple
// protocol mode, which refuses to run unless the session's client_encoding is UTF8,
// and a session in a SQL_ASCII or LATIN1 database has that database's: Run failed
// ("simple protocol queries must be run with client_encoding=UTF8") after trying for
// 30 seconds, and a relay embedded in an application never started.
func TestRelayRunsInAnInstallationNotInUTF8(t *testing.T) {
	t.Parallel()
	for _, enc := range []string{"SQL_ASCII", "LATIN1"} {
		t.Run(enc, func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			pool := pgtest.DBWithEncoding(t, enc)
			// Installed as an older outboxd would have (migrate refuses a new one here).
			_, err := pool.Exec(t.Context(), outboxd.Schema)
			require.NoError(t, err)

			b.pool = pool
			stop := run(t, b.newRelay(t, b.fastConfig()))
			defer stop()
			enqueue(t, pool, "k-1", "webhook", map[string]int{"n": 1})
			waitStatus(t, pool, "k-1", outbox.StatusDelivered)
			require.Equal(t, 1, b.receiver.Effects("k-1"))
		})
	}
}
