package outbox

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// The length checkNumbers counts for a number is the length of PostgreSQL's own text of it
// in a jsonb value.
func TestNumberTextLengthIsPostgreSQLs(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	for _, n := range []string{
		"0", "-0", "0.0", "-0.000", "0e5", "0e-5", "0.0e-3", "1", "-1", "1.50", "1.5e1", "-12.5e1",
		"0.001", "123.456e2", "1e2", "1E+2", "1.0e5", "100e-2", "1e-7", "1.5e-300", "1e300",
		"-9.99e-1", "12345678901234567890.0", "0e-16383", "1e-16383", "1e131071", "5e-324",
	} {
		var want int
		require.NoError(t, tx.QueryRow(t.Context(), `SELECT octet_length(($1::jsonb)::text)`, "["+n+"]").Scan(&want))
		d, ok := parseNumber(n)
		require.True(t, ok, n)
		require.Equal(t, int64(want-2), d.textLen(), "%s is written out as %d bytes", n, want-2)
	}
}
