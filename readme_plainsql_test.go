package outboxd_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// readmeSQL returns the first ```sql block of the README's section headed heading.
func readmeSQL(t *testing.T, heading string) string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n"+heading+"\n")
	require.True(t, ok, "README.md has a section %q", heading)
	_, block, ok := strings.Cut(section, "```sql\n")
	require.True(t, ok, "the section %q shows SQL", heading)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok)
	return block
}

// The README's plain-SQL enqueue runs as written under a role with only the grant it
// says a plain INSERT needs (INSERT on outbox), and runs again, as a step retried after
// its first commit (a lost reply, a job delivered twice) does, leaving the one intent.
// It showed a bare INSERT: run again, it failed on the key's uniqueness and aborted the
// application's transaction, its own work included, and the README did not say how to
// write the step so that it could run again (nor that ON CONFLICT naming the key's
// column needs SELECT on outbox as well, which the grant it gave lacks).
func TestReadmePlainSQLEnqueueRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := pool.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, state text);
		INSERT INTO orders VALUES (42, 'new')`)
	require.NoError(t, err)
	app := pgtest.PoolAs(t, pool, pgtest.Role(t, pool, "outboxd_plain_",
		`GRANT INSERT ON outbox TO ROLE_`, `GRANT SELECT, UPDATE ON orders TO ROLE_`))

	script := readmeSQL(t, "## Enqueue from any language, with plain SQL")
	for run := 1; run <= 2; run++ {
		_, err := app.Exec(ctx, script) // no arguments: the simple protocol runs the whole script
		require.NoError(t, err, "run %d of the README's plain-SQL enqueue", run)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
	require.Equal(t, 1, n, "one intent")
	var state string
	require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM orders WHERE id = 42`).Scan(&state))
	require.Equal(t, "paid", state, "the application's own work committed with it")
}

// The README's way to empty the outbox empties its three tables, and what it says of the
// others holds: TRUNCATE outbox alone is refused, and with CASCADE it keeps the attempts
// log, whose rows a new row that takes an old id (RESTART IDENTITY) would show as its own.
func TestReadmeTruncateEmptiesTheOutbox(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const truncate = `TRUNCATE outbox, outbox_attempts, outbox_audit`
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "`"+truncate+"`")

	pool := pgtest.DB(t)
	fill := func() {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('a', 'webhook', '{}');
			INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous)
			SELECT id, 1, 'r', now(), now(), 'delivered', false FROM outbox;
			INSERT INTO outbox_audit (outbox_id, action, actor) SELECT id, 'replay', 'cli' FROM outbox`)
		require.NoError(t, err)
	}
	count := func(table string) (n int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}
	fill()
	_, err = pool.Exec(ctx, `TRUNCATE outbox`)
	require.ErrorContains(t, err, "foreign key")
	_, err = pool.Exec(ctx, `TRUNCATE outbox RESTART IDENTITY CASCADE`)
	require.NoError(t, err)
	require.Equal(t, 1, count("outbox_attempts"), "CASCADE leaves the attempts log")

	fill()
	_, err = pool.Exec(ctx, truncate)
	require.NoError(t, err)
	for _, table := range []string{"outbox", "outbox_attempts", "outbox_audit"} {
		require.Zero(t, count(table), table)
	}
}
