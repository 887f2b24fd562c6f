package main

import (
	"fmt"

	"github.com/jackc/pgx/v5"
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
			ctx := cmd.Context()
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
			conn, err := pgx.ConnectConfig(ctx, poolCfg.ConnConfig)
			if err != nil {
				return fmt.Errorf("connect: %w", err)
			}
			defer conn.Close(ctx)
			from, err := outboxd.Migrate(ctx, conn)
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
