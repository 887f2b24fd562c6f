package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/pgcluster"
)

// envURL names the variable that points the tests at an existing server.
const envURL = "OUTBOX_TEST_DATABASE_URL"

// errNoServer is what a test that asks for a database fails with when no server is found.
var errNoServer = errors.New("no PostgreSQL found: set " + envURL +
	", start a Docker engine, or install the server (apt-get install postgresql)")

// Timeouts. Each is generous: reaching one means something is stuck, not slow.
const (
	startTimeout = 3 * time.Minute  // pick and start the server, migrate the template
	stmtTimeout  = time.Minute      // one CREATE or DROP DATABASE
	txPoolConns  = 32               // connections for the Tx pool, one per running Tx test
	closeTimeout = 30 * time.Second // each step of Main's teardown
)

var (
	// mainCalled is set by Main, so that a package which forgot its TestMain fails
	// instead of leaving a server running after the test binary exits.
	mainCalled atomic.Bool

	serverOnce sync.Once
	shared     *server // set by serverOnce
	sharedErr  error   // set by serverOnce
)

// Main runs the tests of a package and then cleans up after pgtest: it closes the pools
// [DB] and [Tx] handed out, drops the databases it created on an external server, stops
// the server it started, and checks that no goroutine started during the tests is still
// running. It exits the process with the tests' status. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	mainCalled.Store(true)
	leakOpts := []goleak.Option{goleak.IgnoreCurrent()}

	code := m.Run()

	if s := shared; s != nil {
		if err := s.close(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			code = max(code, 1)
		}
		leakOpts = append(leakOpts, s.leakOpts...)
	}
	// Like goleak.VerifyTestMain: a failed run is not made noisier with leaks.
	if code == 0 {
		if err := goleak.Find(leakOpts...); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: goroutines still running after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// URL creates a fresh database cloned from the migrated template and returns its DSN.
// The database is dropped when the test ends (WITH (FORCE), so connections left open
// don't stop it). No connection is opened: it suits tests that start subprocesses or
// build their own pool.
func URL(t testing.TB) string {
	t.Helper()
	s := get(t)
	name := s.newName()
	if err := s.clone(t.Context(), name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		// t.Context() is already cancelled when cleanups run.
		if err := s.drop(context.Background(), name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return s.url(name)
}

// DB creates a fresh database cloned from the migrated template, as [URL] does, and
// returns a pool on it. The pool is closed, and the database dropped, when the test
// ends. Use it for tests that commit, use several connections or LISTEN/NOTIFY; [Tx] is
// cheaper for the rest.
func DB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	// Registered after URL's cleanup, so it runs before it: the pool is closed, then the
	// database dropped.
	t.Cleanup(pool.Close)
	return pool
}

// InMode returns a second pool on pool's database whose connections use mode, such as
// the simple protocol a transaction pooler needs; it is closed when the test ends.
func InMode(t testing.TB, pool *pgxpool.Pool, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config()
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// ExecModes are the query exec modes other than pgx's default, to run a test in each.
var ExecModes = []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec}

// Tx begins a transaction on a database shared by every Tx caller in the test binary,
// migrated like the template, and rolls it back when the test ends. Nothing commits, so
// parallel tests don't see each other's rows. They can still wait on each other: a row
// whose unique key another running test has inserted blocks until that test ends.
//
// Don't commit the transaction; use [DB] for that.
func Tx(t testing.TB) pgx.Tx {
	t.Helper()
	s := get(t)
	pool, err := s.sharedPool()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatalf("pgtest: begin: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stmtTimeout)
		defer cancel()
		// ErrTxClosed: the test ended the transaction itself. Any other failure means the
		// connection broke, and pgx has discarded it already.
		_ = tx.Rollback(ctx)
	})
	return tx
}

// Cluster starts a private PostgreSQL cluster for one test, from the local server
// binaries, and stops it when the test ends. It is for tests that restart the server
// ([pgcluster.Cluster.Restart]); its databases are not migrated, so such a test runs
// [outboxd.Migrate] itself. OUTBOX_TEST_DATABASE_URL and Docker don't help here: without
// local binaries the test fails.
func Cluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if errors.Is(err, pgcluster.ErrNotFound) {
		t.Fatal("pgtest: this test restarts PostgreSQL, so it needs the server binaries on this machine " +
			"(initdb and pg_ctl): install the server (apt-get install postgresql)")
	}
	if err != nil {
		t.Fatalf("pgtest: start a private cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return c
}

// get returns the test binary's server, starting it on first use.
func get(t testing.TB) *server {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("pgtest: the package's TestMain must call pgtest.Main: func TestMain(m *testing.M) { pgtest.Main(m) }")
	}
	serverOnce.Do(func() {
		shared, sharedErr = startServer(testing.Verbose())
	})
	if sharedErr != nil {
		t.Fatalf("pgtest: %v", sharedErr)
	}
	return shared
}

// server is the PostgreSQL server of one test binary, with its template database.
type server struct {
	dsn      string          // DSN of the database we administer from
	admin    *pgxpool.Pool   // on dsn, for CREATE and DROP DATABASE
	external bool            // from OUTBOX_TEST_DATABASE_URL: drop what we created there
	stop     func() error    // stops the server we started; nil for an external one
	leakOpts []goleak.Option // goroutines that outlive the server's library, not ours

	prefix   string // outboxd_test_<pid>_<random>, unique to this process
	template string
	seq      atomic.Int64

	// cloneMu serialises CREATE DATABASE … TEMPLATE: concurrent clones of one template
	// fail with "source database is being accessed by other users".
	cloneMu sync.Mutex

	// txMu guards the pool shared by Tx callers, opened on first use. Lock order:
	// txMu, then cloneMu, then mu.
	txMu  sync.Mutex
	txDB  *pgxpool.Pool
	txErr error

	mu   sync.Mutex
	live map[string]bool // databases created and not dropped yet
}

// startServer picks a server as the package doc describes and migrates a template on it.
func startServer(verbose bool) (*server, error) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), startTimeout,
		fmt.Errorf("starting PostgreSQL for the tests took more than %s", startTimeout))
	defer cancel()

	s, err := pickServer(ctx, verbose)
	if err != nil {
		return nil, err
	}
	if err := s.init(ctx); err != nil {
		if cerr := s.close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	return s, nil
}

func pickServer(ctx context.Context, verbose bool) (*server, error) {
	if dsn := os.Getenv(envURL); dsn != "" {
		// An explicit choice: a wrong URL is an error, not a reason to try something else.
		if _, err := pgx.ParseConfig(dsn); err != nil {
			return nil, fmt.Errorf("%s: %w", envURL, err)
		}
		return &server{dsn: dsn, external: true}, nil
	}

	var dockerErr error
	if dockerAnswers(ctx, verbose) {
		s, err := startContainer(ctx)
		if err == nil {
			return s, nil
		}
		dockerErr = err
	}

	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	switch {
	case errors.Is(err, pgcluster.ErrNotFound) && dockerErr != nil:
		return nil, fmt.Errorf("%w (a Docker engine answered, but %v)", errNoServer, dockerErr)
	case errors.Is(err, pgcluster.ErrNotFound):
		return nil, errNoServer
	case err != nil:
		return nil, fmt.Errorf("start PostgreSQL from the local binaries: %w", err)
	}
	return &server{dsn: c.URL("postgres"), stop: c.Stop}, nil
}

// init opens the admin pool and creates the migrated template database.
func (s *server) init(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(s.dsn)
	if err != nil {
		return fmt.Errorf("parse DSN: %w", err)
	}
	cfg.MaxConns = 4
	s.admin, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if err := s.admin.Ping(ctx); err != nil {
		if s.external {
			return fmt.Errorf("connect to %s (%s): %w", redact(s.dsn), envURL, err)
		}
		return fmt.Errorf("connect to %s: %w", redact(s.dsn), err)
	}

	var random [3]byte
	_, _ = rand.Read(random[:])
	s.prefix = fmt.Sprintf("outboxd_test_%d_%s", os.Getpid(), hex.EncodeToString(random[:]))
	s.template = s.prefix + "_template"
	s.live = map[string]bool{}

	if err := s.create(ctx, s.template, ""); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, s.url(s.template))
	if err != nil {
		return fmt.Errorf("connect to template: %w", err)
	}
	_, err = outboxd.Migrate(ctx, conn)
	if cerr := conn.Close(ctx); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	// A connection to the template makes every clone fail. Refusing them keeps a stray
	// one (a test connecting to the wrong DSN) from breaking unrelated tests.
	_, err = s.admin.Exec(ctx, `ALTER DATABASE `+ident(s.template)+` WITH ALLOW_CONNECTIONS false`)
	if err != nil {
		return fmt.Errorf("close template to connections: %w", err)
	}
	return nil
}

// newName returns a database name not used before by this process.
func (s *server) newName() string {
	return fmt.Sprintf("%s_%d", s.prefix, s.seq.Add(1))
}

// clone creates database name from the template.
func (s *server) clone(ctx context.Context, name string) error {
	s.cloneMu.Lock()
	defer s.cloneMu.Unlock()
	return s.create(ctx, name, s.template)
}

// create creates database name, as a copy of template unless that is empty.
func (s *server) create(ctx context.Context, name, template string) error {
	ctx, cancel := context.WithTimeout(ctx, stmtTimeout)
	defer cancel()
	sql := `CREATE DATABASE ` + ident(name)
	if template != "" {
		sql += ` TEMPLATE ` + ident(template)
	}
	if _, err := s.admin.Exec(ctx, sql); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	s.mu.Lock()
	s.live[name] = true
	s.mu.Unlock()
	return nil
}

// drop drops database name, disconnecting whoever is still connected.
func (s *server) drop(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, stmtTimeout)
	defer cancel()
	if _, err := s.admin.Exec(ctx, `DROP DATABASE IF EXISTS `+ident(name)+` WITH (FORCE)`); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	s.mu.Lock()
	delete(s.live, name)
	s.mu.Unlock()
	return nil
}

// sharedPool returns the pool of the database shared by Tx callers, creating it on
// first use.
func (s *server) sharedPool() (*pgxpool.Pool, error) {
	s.txMu.Lock()
	defer s.txMu.Unlock()
	if s.txDB == nil && s.txErr == nil {
		s.txDB, s.txErr = s.openShared()
	}
	return s.txDB, s.txErr
}

// openShared clones the database shared by Tx callers and opens its pool.
func (s *server) openShared() (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	name := s.prefix + "_tx"
	if err := s.clone(ctx, name); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(s.url(name))
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	// Each running Tx test holds a connection until it ends; the default (4 on small
	// machines) would make parallel tests queue, or deadlock one that calls Tx twice.
	cfg.MaxConns = txPoolConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool on %s: %w", name, err)
	}
	return pool, nil
}

// url returns the DSN of database name on the server.
func (s *server) url(name string) string {
	dsn, _ := withDatabase(s.dsn, name) // s.dsn parsed in init
	return dsn
}

// close releases everything: the Tx pool, on an external server the databases we
// created, the admin pool, and the server we started.
func (s *server) close() error {
	var errs []error
	s.txMu.Lock()
	if s.txDB != nil {
		s.txDB.Close()
	}
	s.txMu.Unlock()
	if s.external && s.admin != nil {
		s.mu.Lock()
		names := make([]string, 0, len(s.live))
		for name := range s.live {
			names = append(names, name)
		}
		s.mu.Unlock()
		for _, name := range names {
			ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			errs = append(errs, s.drop(ctx, name))
			cancel()
		}
	}
	if s.admin != nil {
		s.admin.Close()
	}
	if s.stop != nil {
		if err := s.stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop PostgreSQL: %w", err))
		}
	}
	return errors.Join(errs...)
}

// ident quotes a database name for SQL.
func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// withDatabase returns dsn with its database replaced by name. dsn is a URL
// (postgres://…) or keyword/value settings (host=… dbname=…), as pgx accepts.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	// A later setting overrides an earlier one. Our names need no quoting, but a
	// quoted value is always valid.
	return dsn + " dbname='" + name + "'", nil
}

// redact hides the password in a URL DSN for error messages.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		return u.Redacted()
	}
	return "the server"
}
