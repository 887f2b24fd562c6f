package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// Bouncer is a PgBouncer in transaction pooling mode in front of one PostgreSQL server,
// with PgBouncer's defaults otherwise (no ignore_startup_parameters): the pooler the
// README's advice for transaction poolers is tested against.
type Bouncer struct {
	port int
	dir  string
	proc *process
}

// StartBouncer starts PgBouncer (from PATH, or /usr/sbin as Debian's package installs it)
// on a free loopback port, passing every database to the server at host:port, and
// returns once it answers for user. It trusts every user it knows, user alone. Call
// [Bouncer.Stop] to stop it. As the server, it runs as the postgres OS user when the
// process is root, which PgBouncer refuses to run as.
func StartBouncer(ctx context.Context, host string, port int, user string) (*Bouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, serr := os.Stat(bin); serr != nil {
			return nil, errors.New("pgbouncer not found on PATH or in /usr/sbin: apt-get install pgbouncer (.ci/run installs it)")
		}
	}
	o, err := serverOwner()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(tempBase(o), "outboxd-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	b := &Bouncer{dir: dir}
	fail := func(err error) (*Bouncer, error) {
		b.Stop()
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	if err := o.chown(dir); err != nil {
		return fail(err)
	}
	if b.port, err = freePort(); err != nil {
		return fail(err)
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
`, host, port, b.port, filepath.Join(dir, "users.txt"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(strconv.Quote(user)+` ""`+"\n"), 0o644); err != nil {
		return fail(err)
	}
	logPath := filepath.Join(dir, "pgbouncer.log")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = withParentDeathSignal(withOwnProcessGroup(o.sysProcAttr()))
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	b.proc = &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		b.proc.err = cmd.Wait()
		close(b.proc.exited)
	}()
	if err := b.waitReady(ctx, user); err != nil {
		log, _ := os.ReadFile(logPath)
		return fail(fmt.Errorf("%w; its log:\n%s", err, log))
	}
	return b, nil
}

// Port is the loopback port PgBouncer listens on.
func (b *Bouncer) Port() int { return b.port }

// waitReady runs a query through the bouncer until it answers, and fails early if it
// exits.
func (b *Bouncer) waitReady(ctx context.Context, user string) error {
	dsn := fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&connect_timeout=5&default_query_exec_mode=simple_protocol",
		user, net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)))
	return b.proc.waitAnswers(ctx, "pgbouncer", func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var one int
		return conn.QueryRow(ctx, `SELECT 1`).Scan(&one)
	})
}

// Stop kills PgBouncer, waits for it to exit and removes its directory.
func (b *Bouncer) Stop() {
	if b.proc != nil {
		_ = b.proc.cmd.Process.Kill()
		<-b.proc.exited
	}
	_ = os.RemoveAll(b.dir)
}
