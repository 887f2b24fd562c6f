package ops_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// behindDB returns a pool on a database whose clock runs two hours behind this machine's,
// as the database's host can when the operator's machine (or the database's) is off:
// clock_timestamp() and now() are looked up first in a schema whose functions subtract two
// hours. Relays correct their clocks to the database's, so every time they write is on it.
func behindDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `
CREATE SCHEMA dbclock;
CREATE FUNCTION dbclock.clock_timestamp() RETURNS timestamptz LANGUAGE sql
    AS $$ SELECT pg_catalog.clock_timestamp() - interval '2 hours' $$;
CREATE FUNCTION dbclock.now() RETURNS timestamptz LANGUAGE sql
    AS $$ SELECT pg_catalog.now() - interval '2 hours' $$`)
	require.NoError(t, err)
	pc := pool.Config()
	pc.ConnConfig.RuntimeParams["search_path"] = "dbclock, pg_catalog, public"
	behind, err := pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	t.Cleanup(behind.Close)
	return behind
}

// finishedAgo inserts a delivered row with key, finished d ago by the database's clock.
func finishedAgo(t *testing.T, pool *pgxpool.Pool, key string, d time.Duration) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, created_at, updated_at, delivered_at)
SELECT $1, 'webhook', '{}', 'delivered', 1, t, t, t FROM (SELECT clock_timestamp() - $2::interval AS t) AS c`, key, d)
	require.NoError(t, err)
}

// A delivered row is the stored answer for its key: deleted, an enqueue of the same key
// inserts a new intent and the effect happens again. purge --older-than counted from the
// operator's machine's clock, and with that clock two hours ahead of the database's (on
// whose clock relays write when rows finished), purge --older-than 1h deleted a row that
// had finished half an hour before.
func TestPurgeCountsAgesOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	pool := behindDB(t)
	finishedAgo(t, pool, "recent", 30*time.Minute)
	finishedAgo(t, pool, "old", 90*time.Minute)

	res, err := ops.Purge(t.Context(), pool, time.Hour, ops.PurgeOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.Rows, "rows finished more than an hour ago")
	res, err = ops.Purge(t.Context(), pool, time.Hour, ops.PurgeOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Rows)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM outbox WHERE idempotency_key = 'recent'`),
		"the row that finished half an hour ago is kept")
}

// deadSince inserts a dead row with key, created d ago by the database's clock.
func deadSince(t *testing.T, pool *pgxpool.Pool, key string, d time.Duration) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, created_at, updated_at)
SELECT $1, 'webhook', '{}', 'dead', 1, t, t FROM (SELECT clock_timestamp() - $2::interval AS t) AS c`, key, d)
	require.NoError(t, err)
}

// list and replay --older-than and --newer-than counted from the operator's machine's
// clock, while rows are created on the database's: with the machine two hours ahead,
// "newer than an hour" found none of the rows created in the last hour, and "older than
// an hour" selected rows created half an hour before, for a replay too.
func TestFilterAgesCountOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	pool := behindDB(t)
	deadSince(t, pool, "recent", 30*time.Minute)
	deadSince(t, pool, "old", 90*time.Minute)
	keys := func(p ops.Page) []string {
		var out []string
		for _, in := range p.Intents {
			out = append(out, in.Key)
		}
		return out
	}

	page, err := ops.List(t.Context(), pool, ops.Filter{NewerThan: time.Hour})
	require.NoError(t, err)
	require.Equal(t, []string{"recent"}, keys(page))
	page, err = ops.List(t.Context(), pool, ops.Filter{OlderThan: time.Hour})
	require.NoError(t, err)
	require.Equal(t, []string{"old"}, keys(page))

	res, err := ops.Replay(t.Context(), pool, ops.Selection{Filter: &ops.Filter{Status: []string{"dead"}, OlderThan: time.Hour}},
		ops.ReplayOptions{Actor: "alice", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []string{"old"}, res.Replayed)
}

// Approve and reject stamped the row's updated_at and the audit entry with the clock
// of the machine they ran on, and so did the intent API and MCP (serve's host) for
// cancel too, though every other time of a row is the database's: the audit trail
// read out of order with the attempts, a canceled row's retention counted from another
// clock, and an API cancel of a row in flight, on a host whose clock ran ahead, said
// its relay's lease had expired. They now use the database's clock.
func TestDecisionsUseTheDatabasesClock(t *testing.T) {
	t.Parallel()
	pool := behindDB(t)
	_, err := pool.Exec(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status) VALUES
    ('approve-me', 'webhook', '{}', 'awaiting_approval'), ('reject-me', 'webhook', '{}', 'awaiting_approval');
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, lease_owner, lease_expires_at)
VALUES ('in-flight', 'webhook', '{}', 'delivering', 1, 'relay-1', clock_timestamp() + interval '30 minutes')`)
	require.NoError(t, err)
	_, err = ops.Approve(t.Context(), pool, "approve-me", "alice", "", time.Time{})
	require.NoError(t, err)
	_, err = ops.Reject(t.Context(), pool, "reject-me", "alice", "", time.Time{})
	require.NoError(t, err)
	require.Equal(t, 0, count(t, pool, `
SELECT count(*) FROM outbox o JOIN outbox_audit a ON a.outbox_id = o.id
WHERE abs(extract(epoch FROM o.updated_at - clock_timestamp())) > 60 OR abs(extract(epoch FROM a.at - clock_timestamp())) > 60`),
		"rows and audit entries stamped on another clock than the database's")

	admin := intent.Token{Name: "ops", Admin: true, Connectors: []string{"webhook"}}
	svc := &intent.Service{Pool: pool, Policy: &intent.Policy{Tokens: []intent.Token{admin}}}
	_, _, err = svc.Cancel(t.Context(), &admin, "in-flight", "")
	require.ErrorIs(t, err, intent.ErrConflictState)
	require.ErrorContains(t, err, "in flight: relay relay-1 is delivering it")
}
