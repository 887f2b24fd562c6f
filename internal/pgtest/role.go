package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Role creates a login role named prefix and a random suffix, with USAGE on schema
// public and the grants given, each a statement in which ROLE_ stands for the role, and
// drops it (and what it owns) when the test ends. It returns the role's name. A test on
// a database whose role may not create roles is skipped.
func Role(t testing.TB, pool *pgxpool.Pool, prefix string, grants ...string) string {
	t.Helper()
	ctx := t.Context()
	var mayCreate bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&mayCreate))
	if !mayCreate {
		t.Skip("the test database's role may not create roles")
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	role := prefix + hex.EncodeToString(suffix)
	id := pgx.Identifier{role}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE ROLE `+id+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		_, err := pool.Exec(ctx, `DROP OWNED BY `+id)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `DROP ROLE `+id)
		require.NoError(t, err)
	})
	for _, stmt := range append([]string{`GRANT USAGE ON SCHEMA public TO ROLE_`}, grants...) {
		stmt = strings.ReplaceAll(stmt, "ROLE_", id)
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	return role
}

// PoolAs is a pool on pool's database that logs in as role, closed when the test ends.
func PoolAs(t testing.TB, pool *pgxpool.Pool, role string) *pgxpool.Pool {
	t.Helper()
	return poolWith(t, pool, func(cfg *pgxpool.Config) { cfg.ConnConfig.User = role })
}
