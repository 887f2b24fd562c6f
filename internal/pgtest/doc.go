// Package pgtest gives tests a real PostgreSQL database: an isolated, migrated database
// per test, or a transaction that is rolled back when the test ends.
//
// Each package that uses it calls [Main] from its TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Then a test asks for what it needs:
//
//   - [Tx] for a transaction on a shared migrated database, rolled back at cleanup. It
//     suits most tests: nothing commits, so parallel tests can't see each other's rows.
//   - [DB] for a pool on a fresh database of its own, for tests that commit, use several
//     connections or LISTEN/NOTIFY. [URL] gives the same without opening a pool, for tests
//     that start subprocesses or configure their own pool.
//   - [Cluster] for a private server that the test may restart.
//
// # Which server
//
// The server is chosen once per test binary, the first time a test asks for a database,
// so packages whose tests never do pay nothing:
//
//  1. OUTBOX_TEST_DATABASE_URL, when set: an existing server. The DSN's user needs the
//     CREATEDB privilege. Every database this process creates there has a name starting
//     with outboxd_test_<pid>_ and is dropped at the end.
//  2. testcontainers-go's Postgres module, when a Docker engine answers.
//  3. A throwaway cluster started from the local server binaries with
//     [github.com/outboxd/outboxd/internal/pgcluster].
//
// When none works, the first test that asks for a database fails, saying how to get
// PostgreSQL. Tests never skip for lack of one.
//
// # Template database
//
// A template database is migrated once per process with [outboxd.Migrate]; each [DB] and
// [URL] clones it with CREATE DATABASE … TEMPLATE, which takes tens of milliseconds. The
// clones are serialised within the process, because PostgreSQL refuses to copy a database
// that another session is connected to, and a concurrent clone counts as one.
//
// # Goroutine leaks
//
// After the tests, [Main] closes every pool it handed out, stops the server it started,
// and fails the run if goroutines started during the tests are still running (with
// go.uber.org/goleak).
package pgtest
