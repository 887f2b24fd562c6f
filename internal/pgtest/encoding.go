package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// DBWithEncoding creates an empty database of encoding enc (SQL_ASCII, LATIN1, ...) on
// the test server, with nothing installed in it, and returns a pool on it; both go when
// the test ends.
func DBWithEncoding(t testing.TB, enc string) *pgxpool.Pool {
	t.Helper()
	base := DB(t)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := "enc_" + hex.EncodeToString(suffix)
	_, err := base.Exec(t.Context(), `CREATE DATABASE `+name+` ENCODING '`+enc+`' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = base.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`) })
	u, err := url.Parse(base.Config().ConnString())
	require.NoError(t, err)
	u.Path = "/" + name
	pool, err := pgxpool.New(t.Context(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
