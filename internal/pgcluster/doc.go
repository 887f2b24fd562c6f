// Package pgcluster starts a throwaway PostgreSQL cluster from the local server binaries.
//
// [Start] runs initdb into a fresh temporary directory, starts postgres on a free loopback
// port with trust authentication, and waits until it accepts connections.
// [Cluster.Stop] shuts it down with pg_ctl stop and removes the directory. Tests use it through
// [github.com/outboxd/outboxd/internal/pgtest]; `outboxd demo` and the benchmark command
// use it directly.
//
// # Lifetime
//
// The server runs as a child of the calling process, not as a daemon. On Linux it gets
// SIGQUIT (immediate shutdown) if that process dies without calling [Cluster.Stop], as a
// test binary killed by `go test -timeout` does; only the temporary directory, named
// outboxd-pg-*, is left behind then, and the next [Start] on the machine removes it (on
// Linux, where the directory records which process created it). It runs in a process
// group of its own, so that a
// terminal's Ctrl-C reaches the calling program only, which then stops its clients before
// the server.
//
// # Finding the binaries
//
// [FindBinDir] looks for initdb and pg_ctl on PATH, then in the newest
// /usr/lib/postgresql/*/bin (where Debian and Ubuntu install the server). When neither has
// them, [Start] returns an error wrapping [ErrNotFound].
//
// # Running as root
//
// initdb and postgres refuse to run as root. When the process is root (as it is on our
// machines and in CI), the cluster runs as the `postgres` OS user instead: the temporary
// directory is chowned to it and every command is started with that user's credentials.
//
// # Speed over durability
//
// By default the cluster runs with fsync=off and full_page_writes=off, which is what tests
// want: a crash of the machine loses the cluster, which is thrown away anyway. Benchmarks
// set [Options.Fsync] to measure with durable commits.
package pgcluster
