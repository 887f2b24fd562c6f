package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// A relay that logs in as one role and works as another (options=-c role=…, or ALTER
// ROLE … SET role) may not read its own session's backend_start in pg_stat_activity:
// PostgreSQL shows it only to roles with the privileges of the session's login role.
// Reading the session for fence must not stop the relay from claiming: such a session
// cannot be fenced, as one behind a pooler cannot.
func TestRelayWorksAsARoleItSets(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := t.Context()
	suffix := randomSuffix()
	login, worker := "outboxd_login_"+suffix, "outboxd_worker_"+suffix
	for _, stmt := range []string{
		`CREATE ROLE ` + pgx.Identifier{worker}.Sanitize() + ` NOLOGIN`,
		`CREATE ROLE ` + pgx.Identifier{login}.Sanitize() + ` LOGIN IN ROLE ` + pgx.Identifier{worker}.Sanitize(),
		`GRANT USAGE ON SCHEMA public TO ` + pgx.Identifier{worker}.Sanitize(),
		`GRANT ALL ON ALL TABLES IN SCHEMA public TO ` + pgx.Identifier{worker}.Sanitize(),
		`GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO ` + pgx.Identifier{worker}.Sanitize(),
	} {
		_, err := b.pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, err := b.pool.Exec(ctx, `DROP OWNED BY `+pgx.Identifier{login}.Sanitize()+`, `+pgx.Identifier{worker}.Sanitize())
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, `DROP ROLE `+pgx.Identifier{login}.Sanitize()+`, `+pgx.Identifier{worker}.Sanitize())
		require.NoError(t, err)
	})
	pcfg := b.pool.Config().Copy()
	pcfg.ConnConfig.User = login
	pcfg.ConnConfig.RuntimeParams["options"] = "-c role=" + worker
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var user string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_user`).Scan(&user))
	require.Equal(t, worker, user)

	_, cfg := b.clockedConfig(t)
	start(t, pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	enqueue(t, b.pool, "as-a-role", "webhook", map[string]int{"n": 1})
	in := waitStatus(t, b.pool, "as-a-role", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts)
}

// A role the database refuses the outbox's tables (no privileges granted) fails Run at
// once with the database's reason, rather than after the half minute the relay waits
// for a database that is not up yet.
func TestRunFailsAtOnceWhenTheSchemaIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	pool := pgtest.PoolAs(t, b.pool, pgtest.Role(t, b.pool, "outboxd_refused_"))

	_, cfg := b.clockedConfig(t)
	r, err := New(pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	// Well inside the relay's wait for a database that is not up (30 s).
	runCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = r.Run(runCtx)
	require.ErrorContains(t, err, "permission denied for table outbox_schema_migrations")
}

// setupRoles is setup for a test that creates roles: skipped where the test database's
// role may not.
func setupRoles(t *testing.T) *testBundle {
	t.Helper()
	b := setup(t, receiver.Options{})
	var mayCreate bool
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&mayCreate))
	if !mayCreate {
		t.Skip("the test database's role may not create roles")
	}
	return b
}

// The relay runs as a role with only the privileges the README gives it (it does not
// own the tables): it delivers, retries, sends a refused row to dead, reclaims an
// expired lease, deletes a row past retention, and stops. An outcome write that read
// outbox_audit (to keep a late answer from undoing a replay) failed every outcome with
// "permission denied for table outbox_audit", and rows stayed delivering.
func TestRelayWorksWithTheREADMEsPrivileges(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	pool := pgtest.PoolAs(t, b.pool, pgtest.Role(t, b.pool, "outboxd_relay_",
		`GRANT SELECT, UPDATE, DELETE ON outbox TO ROLE_`,
		`GRANT SELECT, INSERT, DELETE ON outbox_attempts TO ROLE_`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_wake_connectors TO ROLE_`,
		`GRANT SELECT ON outbox_schema_migrations TO ROLE_`))

	b.receiver.Plan("retried", receiver.Plan{FailFirst: 1})
	b.receiver.Plan("refused", receiver.Plan{PermanentStatus: 400})
	b.receiver.Plan("chain-1", receiver.Plan{FailFirst: 1}) // parks chain-2 behind it
	r, stop := start(t, pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	for _, key := range []string{"plain", "retried", "refused"} {
		enqueue(t, b.pool, key, "webhook", map[string]string{"key": key})
	}
	enqueueOrdered(t, b.pool, "chain-1", "chain")
	enqueueOrdered(t, b.pool, "chain-2", "chain")
	waitStatus(t, b.pool, "plain", outbox.StatusDelivered)
	waitStatus(t, b.pool, "retried", outbox.StatusDelivered)
	waitStatus(t, b.pool, "refused", outbox.StatusDead)
	waitStatus(t, b.pool, "chain-2", outbox.StatusDelivered)

	// The background work: reclaiming a lease that expired, deleting a row past
	// retention (and its attempts), the row statistics, parking a row behind a held one
	// and behind one in flight.
	_, err := b.pool.Exec(ctx, `
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, lease_owner, lease_expires_at, updated_at)
VALUES ('expired', 'webhook', '{}', 'delivering', 1, 'gone', now() - interval '1 minute', now() - interval '2 minutes'),
       ('old', 'webhook', '{}', 'delivered', 1, NULL, NULL, now() - interval '1000 hours')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `
INSERT INTO outbox (idempotency_key, connector, payload, ordering_key, status, attempts, lease_owner, lease_expires_at, created_at)
VALUES ('flying', 'webhook', '{}', 'flight', 'delivering', 1, $1, now() + interval '1 hour', now() - interval '2 hours')`, r.cfg.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `
INSERT INTO outbox (idempotency_key, connector, payload, ordering_key, status, attempts, next_attempt_at)
VALUES ('waits', 'webhook', '{}', 'held', 'held', 1, now()),
       ('behind', 'webhook', '{}', 'held', 'pending', 0, now() - interval '1 hour')`)
	require.NoError(t, err)
	// Enough rows behind "flying" for a pass to park them (parkBehindMin).
	_, err = b.pool.Exec(ctx, `
INSERT INTO outbox (idempotency_key, connector, payload, ordering_key, status, attempts, next_attempt_at)
SELECT 'after-' || i, 'webhook', '{}', 'flight', 'pending', 0, now() - interval '1 hour'
FROM generate_series(1, $1) AS i`, parkBehindMin)
	require.NoError(t, err)
	r.reclaim(ctx)
	r.deleteExpired(ctx)
	r.refreshStats(ctx)
	r.claimedOrdered.Add(1) // "flying", which is leased to r, as if r had claimed it
	for _, key := range []string{"behind", "after-1"} {
		// The running relay's own passes may hold the rows meanwhile (the passes skip
		// locked rows).
		require.Eventually(t, func() bool {
			r.parkWaiting(ctx)
			r.parkInFlight(ctx)
			in, err := outbox.Get(ctx, b.pool, key)
			require.NoError(t, err)
			return strings.HasPrefix(in.LastError, "waiting behind row")
		}, waitTimeout, 10*time.Millisecond, "%s is parked", key)
	}
	r.claimedOrdered.Add(-1)
	require.Zero(t, dbErrorsTotal(t, r), "database errors")
	waitStatus(t, b.pool, "expired", outbox.StatusDelivered)
	_, err = outbox.Get(ctx, b.pool, "old")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	stop()
}

// A role that may read the schema's version but not work the outbox's rows (the
// application's role, say) fails Run at once with one error naming what it lacks.
// It used to start, say it had, and log a warning for the claim and the reclaim of
// every poll, for ever, while readiness said all was well.
func TestRunFailsAtOnceWithoutTheRelaysPrivileges(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	ctx := t.Context()
	role := pgtest.Role(t, b.pool, "outboxd_app_",
		`GRANT SELECT, INSERT ON outbox TO ROLE_`,
		`GRANT SELECT ON outbox_schema_migrations, outbox_attempts TO ROLE_`)
	pool := pgtest.PoolAs(t, b.pool, role)

	r, err := New(pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
	require.NoError(t, err)
	runCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = r.Run(runCtx)
	require.EqualError(t, err, `relay: role `+role+` lacks privileges the relay needs: UPDATE on outbox; INSERT on outbox_attempts`)
}

// A role that may deliver but not delete (retention) starts, as it did before the relay
// checked its privileges, and says once, loudly, what it lacks: refusing it would stop,
// at an upgrade, a relay that delivered.
func TestRunWithoutRetentionPrivilegesDeliversAndSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	role := pgtest.Role(t, b.pool, "outboxd_nodelete_",
		`GRANT SELECT, INSERT, UPDATE ON outbox, outbox_wake_connectors TO ROLE_`,
		`GRANT SELECT, INSERT ON outbox_attempts TO ROLE_`,
		`GRANT SELECT ON outbox_schema_migrations TO ROLE_`)
	var logs logBuffer
	cfg := b.fastConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	start(t, pgtest.PoolAs(t, b.pool, role), cfg, map[string]Instance{"webhook": {Connector: b.hook}})
	enqueue(t, b.pool, "delivered", "webhook", []int{1})
	waitStatus(t, b.pool, "delivered", outbox.StatusDelivered)
	require.Contains(t, logs.String(), "grant DELETE on outbox; DELETE on outbox_attempts to role "+role)
}
