package outbox

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// The length checkStorable counts for a number is the length of PostgreSQL's own text of it
// in a jsonb value; the size it counts (numericSize) is never less than PostgreSQL's size
// of it as a numeric (which jsonb stores as it is), and at most numeric's long header
// more.
func TestNumberTextLengthIsPostgreSQLs(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	for _, n := range []string{
		"0", "-0", "0.0", "-0.000", "0e5", "0e-5", "0.0e-3", "1", "-1", "1.50", "1.5e1", "-12.5e1",
		"0.001", "123.456e2", "1e2", "1E+2", "1.0e5", "100e-2", "1e-7", "1.5e-300", "1e300",
		"-9.99e-1", "12345678901234567890.0", "0e-16383", "1e-16383", "1e131071", "5e-324",
		"9999", "10000", "10001", "0.0001", "0.00001", "12345.6789", "1e-5", "1e8",
		"123456789012345678901234567890e-20",
	} {
		var want int
		require.NoError(t, tx.QueryRow(t.Context(), `SELECT octet_length(($1::jsonb)::text)`, "["+n+"]").Scan(&want))
		d, ok := parseNumber(n)
		require.True(t, ok, n)
		require.Equal(t, int64(want-2), d.textLen(), "%s is written out as %d bytes", n, want-2)

		var size int64
		require.NoError(t, tx.QueryRow(t.Context(), `SELECT pg_column_size($1::numeric)`, n).Scan(&size))
		require.GreaterOrEqual(t, d.numericSize(), size, "%s takes %d bytes as a numeric", n, size)
		require.LessOrEqual(t, d.numericSize(), size+2, "%s takes %d bytes as a numeric", n, size)
	}
}
