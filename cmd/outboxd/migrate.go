package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/config"
)

func newMigrateCmd(e *env) *cobra.Command {
	// --database-url as every operator command has it: they say "run outboxd migrate
	// first" on a database without the schema, which may be the flag's.
	var db dbFlag
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox schema",
		Long: "migrate applies the schema embedded in this binary to OUTBOX_DATABASE_URL (or --database-url). It is safe to run " +
			"again and from several processes at once; rows are never dropped.",
		Example: "  OUTBOX_DATABASE_URL=postgres://app@localhost/app outboxd migrate",
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := db.resolve(e)
			if err != nil {
				return err
			}
			// A stop cancels the statement under way, on the server too (see below), and
			// a second signal ends the process at once.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			context.AfterFunc(ctx, stop)
			// Parsed as the pool parses it, so that pool settings in the DSN
			// (pool_max_conns=...), which every command reads, are not sent to the
			// server as run-time parameters. Only the flag's DSN can fail here (resolve
			// checked the variable's as it read it), so the problem names the flag, as
			// the operator commands' do: naming the variable sent a user of the flag to
			// fix a value that may not even be set.
			poolCfg, err := config.ParseDSN("--database-url", url)
			if err != nil {
				return usageError{err}
			}
			boundConnect(poolCfg)
			// pgx's default on a cancelled context only closes the connection, and a
			// server session waiting for a lock (behind a long transaction on outbox, or
			// another migration) or building an index does not notice its client has
			// gone until it next writes to it: after Ctrl-C it stayed in the lock queue,
			// every writer of outbox queued behind it, until that lock came free. A
			// cancel request stops the statement at once, and the transaction rolls back.
			poolCfg.ConnConfig.BuildContextWatcherHandler = func(pgConn *pgconn.PgConn) ctxwatch.Handler {
				return &pgconn.CancelRequestContextWatcherHandler{Conn: pgConn, DeadlineDelay: time.Second}
			}
			// Connected as a pool connects: its BeforeConnect asks for read committed
			// where the sessions' default is another (config.SessionDefaults).
			var conn *pgx.Conn
			if poolCfg.BeforeConnect != nil {
				err = poolCfg.BeforeConnect(ctx, poolCfg.ConnConfig)
			}
			if err == nil {
				conn, err = pgx.ConnectConfig(ctx, poolCfg.ConnConfig)
			}
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("stopped (%v) before connecting: nothing was changed", context.Cause(ctx))
			}
			if err != nil {
				return fmt.Errorf("connect: %w", err)
			}
			defer conn.Close(ctx)
			from, err := outboxd.Migrate(ctx, conn)
			if err != nil && ctx.Err() != nil {
				// One transaction: it rolled back, unless the signal came as it
				// committed, which a second run tells.
				return fmt.Errorf("stopped (%v) before the migration finished; it is one transaction: "+
					"run outboxd migrate again to apply it, or to see that it was", context.Cause(ctx))
			}
			if err != nil {
				return err
			}
			if from == outboxd.SchemaVersion {
				fmt.Fprintf(e.stdout, "schema already at version %d\n", from)
			} else {
				fmt.Fprintf(e.stdout, "schema migrated from version %d to %d\n", from, outboxd.SchemaVersion)
			}
			return nil
		},
	}
	db.register(cmd)
	return cmd
}
