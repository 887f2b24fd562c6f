package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// opsDB is a fresh database for the operator commands' tests: its DSN, the environment
// that points the commands at it, and a pool for fixtures and checks.
type opsDB struct {
	dsn     string
	environ []string
	pool    *pgxpool.Pool
}

func newOpsDB(t *testing.T, extraEnv ...string) *opsDB {
	t.Helper()
	dsn := pgtest.URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &opsDB{dsn: dsn, pool: pool, environ: append([]string{"OUTBOX_DATABASE_URL=" + dsn, "USER=alice"}, extraEnv...)}
}

// cli runs one command line against the database, with stdin from a string (not a
// terminal), and returns the exit code and outputs.
func (d *opsDB) cli(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLI(t, d.environ, strings.NewReader(stdin), args...)
}

func runCLI(t *testing.T, environ []string, stdin io.Reader, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), args, environ, stdin, &out, &errb)
	return code, out.String(), errb.String()
}

// fixture is a row written with plain SQL; zero fields get defaults.
type fixture struct {
	Key, Connector, Status string
	Age                    time.Duration // created_at = now - Age (default 1h)
	UpdatedAgo             time.Duration // updated_at = now - UpdatedAgo (default Age)
	LeaseIn                time.Duration // delivering: lease_expires_at = now + LeaseIn
	LastError, OrderingKey string
	Ambiguous              bool
	Attempts               int
	Payload                string
}

func (d *opsDB) insert(t *testing.T, f fixture) int64 {
	t.Helper()
	now := time.Now()
	if f.Connector == "" {
		f.Connector = "webhook"
	}
	if f.Status == "" {
		f.Status = outbox.StatusPending
	}
	if f.Age == 0 {
		f.Age = time.Hour
	}
	if f.UpdatedAgo == 0 {
		f.UpdatedAgo = f.Age
	}
	if f.Payload == "" {
		f.Payload = fmt.Sprintf(`{"key": %q}`, f.Key)
	}
	var leaseOwner, lastError, orderingKey, result *string
	var leaseExp, deliveredAt *time.Time
	if f.Status == outbox.StatusDelivering {
		owner, exp := "relay-1", now.Add(f.LeaseIn)
		leaseOwner, leaseExp = &owner, &exp
	}
	if f.Status == outbox.StatusDelivered {
		at, res := now.Add(-f.UpdatedAgo), `{"status": 200}`
		deliveredAt, result = &at, &res
	}
	if f.LastError != "" {
		lastError = &f.LastError
	}
	if f.OrderingKey != "" {
		orderingKey = &f.OrderingKey
	}
	var id int64
	err := d.pool.QueryRow(t.Context(), `
INSERT INTO outbox (idempotency_key, connector, payload, status, attempts, next_attempt_at, last_error,
                    result, ordering_key, lease_owner, lease_expires_at, ambiguous, created_at, updated_at,
                    delivered_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
RETURNING id`,
		f.Key, f.Connector, f.Payload, f.Status, f.Attempts, now.Add(-f.Age), lastError, result, orderingKey,
		leaseOwner, leaseExp, f.Ambiguous, now.Add(-f.Age), now.Add(-f.UpdatedAgo), deliveredAt).Scan(&id)
	require.NoError(t, err)
	return id
}

// seedEveryState writes one webhook row in each status, a stuck row, and an old dead
// slack row.
func (d *opsDB) seedEveryState(t *testing.T) {
	t.Helper()
	for _, f := range []fixture{
		{Key: "k-pending", Status: outbox.StatusPending, Age: 2 * time.Hour},
		{Key: "k-delivering", Status: outbox.StatusDelivering, LeaseIn: time.Hour, Attempts: 1},
		{Key: "k-stuck", Status: outbox.StatusDelivering, LeaseIn: -time.Minute, Attempts: 1},
		{Key: "k-delivered", Status: outbox.StatusDelivered, Attempts: 1},
		{Key: "k-dead", Status: outbox.StatusDead, Attempts: 3, UpdatedAgo: time.Minute,
			LastError: "receiver answered 422 Unprocessable Entity"},
		{Key: "k-canceled", Status: outbox.StatusCanceled},
		{Key: "k-awaiting", Status: outbox.StatusAwaitingApproval},
		{Key: "k-held", Status: outbox.StatusHeld, Ambiguous: true, Attempts: 1, LastError: "connection reset"},
		{Key: "s-dead", Connector: "slack", Status: outbox.StatusDead, Attempts: 25, Age: 48 * time.Hour,
			LastError: "channel_not_found"},
	} {
		d.insert(t, f)
	}
}

// status reads a row's status.
func (d *opsDB) status(t *testing.T, key string) string {
	t.Helper()
	in, err := outbox.Get(t.Context(), d.pool, key)
	require.NoError(t, err)
	return in.Status
}

// count runs a counting query.
func (d *opsDB) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, d.pool.QueryRow(t.Context(), sql, args...).Scan(&n))
	return n
}

func TestOpsCommandsHaveExamples(t *testing.T) {
	t.Parallel()
	root := newRootCmd(&env{})
	for _, c := range root.Commands() {
		if c.Name() == "help" || c.Name() == "completion" { // cobra's own
			continue
		}
		require.NotEmpty(t, c.Example, "%s has no Example", c.Name())
	}
	for _, name := range []string{"status", "list", "inspect", "replay", "cancel", "purge", "enqueue"} {
		code, out, _ := runCLI(t, nil, strings.NewReader(""), name, "--help")
		require.Equal(t, exitOK, code)
		require.Contains(t, out, "Examples:", name)
		require.Contains(t, out, "--database-url", name)
	}
	code, out, errOut := runCLI(t, nil, strings.NewReader(""), "completion", "bash")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "bash completion")
}

func TestOpsUsageErrors(t *testing.T) {
	t.Parallel()
	env := []string{"OUTBOX_DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}
	for _, args := range [][]string{
		{"status", "--bogus"},
		{"status", "extra"},
		{"list", "--older-than", "5x"},
		{"list", "--newer-than", "-1h"},
		{"list", "--limit", "ten"},
		{"inspect"},
		{"inspect", "a", "b"},
		{"cancel"},
		{"replay"},
		{"replay", "--key", "a", "--status", "dead"},
		{"replay", "--status", "dead", "--rate", "-1"},
		{"purge"},
		{"purge", "--older-than", "soon"},
		{"enqueue", "--key", "k", "--payload", "{}"},
		{"enqueue", "--connector", "webhook", "--key", "k", "--payload", "{}", "--not-before", "tomorrow"},
	} {
		code, _, errOut := runCLI(t, env, strings.NewReader(""), args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "Run 'outboxd "+args[0]+" --help' for usage.", args)
	}
	// No database URL at all is a usage error too.
	code, _, errOut := runCLI(t, nil, strings.NewReader(""), "status")
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "OUTBOX_DATABASE_URL")
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus" for "outboxd"`},
		{[]string{"replya"}, `unknown command "replya" for "outboxd"; did you mean replay?`},
		{[]string{"token", "nwe"}, `unknown command "nwe" for "outboxd token"; did you mean new?`},
		// cobra's own commands, which it adds only as it runs: "help bogus" showed the
		// root's help and "completion bogus" the completion's, both exiting 0.
		{[]string{"help", "replya"}, `unknown command "replya" for "outboxd"; did you mean replay?`},
		{[]string{"help", "token", "nwe"}, `unknown command "nwe" for "outboxd token"; did you mean new?`},
		{[]string{"completion", "bassh"}, `unknown command "bassh" for "outboxd completion"; did you mean bash?`},
		{[]string{"completion", "bash", "extra"}, `outboxd completion bash takes no arguments, got "extra"`},
	} {
		code, out, errOut := runCLI(t, nil, strings.NewReader(""), tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, tc.args)
		require.Empty(t, out, tc.args)
	}
	// A command that has subcommands, given none, shows its help.
	for _, args := range [][]string{nil, {"token"}, {"completion"}, {"help"}, {"help", "token"}} {
		code, out, errOut := runCLI(t, nil, strings.NewReader(""), args...)
		require.Equal(t, exitOK, code, "%v: %s", args, errOut)
		require.Contains(t, out, "Available Commands:", args)
	}
	// Help on a command, as before.
	code, out, errOut := runCLI(t, nil, strings.NewReader(""), "help", "serve")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "serve delivers the outbox")
}

func TestKeysLeftErrorAgrees(t *testing.T) {
	require.NoError(t, keysLeftError("replayed", nil, nil))
	require.EqualError(t, keysLeftError("replayed", []string{"a"}, nil), "1 of the keys given was not replayed (1 not found, 0 refused)")
	require.EqualError(t, keysLeftError("canceled", []string{"a"}, map[string]string{"b": "x"}), "2 of the keys given were not canceled (1 not found, 1 refused)")
}

// The operator commands on a database nobody has migrated say to run outboxd migrate,
// and print nothing on stdout. They failed with PostgreSQL's `relation "outbox" does not
// exist`, and cancel first printed an empty result ("canceled: 0") as if it had run.
func TestOpsCommandsOnAnUnmigratedDatabaseSayToMigrate(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	_, err := d.pool.Exec(t.Context(), `DROP SCHEMA public CASCADE; CREATE SCHEMA public`)
	require.NoError(t, err)
	for _, args := range [][]string{
		{"status"}, {"status", "--json"}, {"list"}, {"list", "--json"}, {"inspect", "k"},
		{"replay", "--key", "k"}, {"replay", "--status", "dead", "--json"},
		{"cancel", "k"}, {"cancel", "k", "--json"}, {"approve", "k"}, {"reject", "k"},
		{"enqueue", "--connector", "webhook", "--key", "k", "--payload", "{}"},
		{"purge", "--older-than", "1h"},
	} {
		code, out, errOut := d.cli(t, "", args...)
		require.Equal(t, exitFailure, code, "%v: %s", args, errOut)
		require.Equal(t, "outboxd: the database has no outbox schema: run outboxd migrate first\n", errOut, args)
		require.Empty(t, out, args)
	}
	// A database out of reach is still pgx's word for it, not a failure to read the
	// schema's version.
	code, _, errOut := runCLI(t, []string{"OUTBOX_DATABASE_URL=postgres://app@" + pgtest.UnreachableAddr(t) + "/app"},
		strings.NewReader(""), "status")
	require.Equal(t, exitFailure, code, errOut)
	require.True(t, strings.HasPrefix(errOut, "outboxd: failed to connect to `user=app database=app`"), errOut)
}

// --database-url given empty ("$STAGING_URL" unset) is a usage error. It fell back to
// OUTBOX_DATABASE_URL, as if not given, so a purge or a replay meant for one database
// changed the rows of another.
func TestEmptyDatabaseURLFlagIsAUsageError(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "k-old", Status: outbox.StatusDelivered, Age: 48 * time.Hour})
	for _, args := range [][]string{
		{"purge", "--older-than", "24h", "--database-url", ""},
		{"status", "--database-url="},
		{"inspect", "k-old", "--database-url", " "},
	} {
		code, out, errOut := d.cli(t, "", args...)
		require.Equal(t, exitUsage, code, "%v: %s%s", args, out, errOut)
		require.Contains(t, errOut, "--database-url is empty", args)
		require.Empty(t, out, args)
	}
	require.Equal(t, outbox.StatusDelivered, d.status(t, "k-old"))
}

// A --limit the command cannot take is a usage error that names the range, whatever its
// sign: list --limit 0 showed a page of 50 (the library's default for zero) where -1 was
// refused, and replay --limit 0 would have selected every row the filters match.
func TestLimitOutsideItsRangeIsAUsageError(t *testing.T) {
	t.Parallel()
	env := []string{"OUTBOX_DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "--limit", "0"}, "--limit: 0 is not between 1 and 1000 rows a page"},
		{[]string{"list", "--limit", "-1"}, "--limit: -1 is not between 1 and 1000 rows a page"},
		{[]string{"list", "--limit", "1001"}, "--limit: 1001 is not between 1 and 1000 rows a page"},
		{[]string{"replay", "--status", "dead", "--limit", "0"}, "--limit: 0 is not a number of rows (1 or more)"},
		{[]string{"replay", "--status", "dead", "--limit", "-2"}, "--limit: -2 is not a number of rows (1 or more)"},
	} {
		code, out, errOut := runCLI(t, env, strings.NewReader(""), tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, tc.args)
		require.Empty(t, out, tc.args)
	}
}
