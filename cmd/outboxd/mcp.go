package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/config"
	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/mcpserver"
)

func newMCPCmd(e *env) *cobra.Command {
	var db dbFlag
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the intent tools to an AI agent over MCP on stdin and stdout",
		Long: "mcp speaks the Model Context Protocol on stdin and stdout, for an MCP client that starts it as a " +
			"subprocess. It offers the tools propose_intent, get_intent and list_intents: an agent proposes side " +
			"effects instead of performing them, and reads back what happened.\n\n" +
			"Every call acts as the API token whose secret is in OUTBOX_MCP_TOKEN, one of OUTBOX_API_TOKENS, so the " +
			"token's connectors and OUTBOX_APPROVAL_REQUIRED apply as in the intent HTTP API. Logs go to stderr; " +
			"stdout carries only protocol messages. `outboxd serve` offers the same tools at /mcp over HTTP.",
		Example: `  OUTBOX_DATABASE_URL=postgres://outboxd@localhost/app \
  OUTBOX_API_TOKENS='[{"name":"agent","sha256":"<hex>","connectors":["webhook","slack"]}]' \
  OUTBOX_APPROVAL_REQUIRED=payment \
  OUTBOX_MCP_TOKEN=obx_... \
  outboxd mcp`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logCfg, err := config.LoadLog(e.environ)
			if err != nil {
				return usageError{err}
			}
			api, err := config.LoadAPI(e.environ)
			if err != nil {
				return usageError{err}
			}
			if api.MCPToken == "" {
				return usagef("mcp needs OUTBOX_MCP_TOKEN: the secret of the OUTBOX_API_TOKENS entry whose " +
					"connectors the agent may use (outboxd token new makes one)")
			}
			policy := api.Policy()
			tok, err := policy.Authenticate(api.MCPToken.Reveal())
			if err != nil {
				// The message never holds the secret.
				return usageError{fmt.Errorf("OUTBOX_MCP_TOKEN: %w", err)}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// Not open: a database that is down is a tool error at each call, which
			// the agent can retry, rather than no server at all.
			pool, err := db.openPool(ctx, e)
			if err != nil {
				return err
			}
			defer pool.Close()
			// One that answers and was never migrated fails every call until someone
			// runs migrate, with an "internal error" the agent would retry for ever and
			// a reason only in the log, which an MCP client seldom shows: refused now,
			// as serve refuses it. Any other failure to look is left to the calls (a
			// database that never answers delays the start by its connect timeout).
			// So is one that answers and refuses the session for good (a database or a
			// role that does not exist, a wrong password): every call would say the
			// database is unavailable and that calling again later is safe, which no
			// later call makes true.
			if err := checkSchema(ctx, pool); errors.Is(err, errNoSchema) || sessionRefused(err) {
				return err
			}

			logger := newLogger(e.stderr, logCfg)
			logger.InfoContext(ctx, "outboxd mcp serving on stdio", "version", buildVersion(),
				"token", tok.Name, "connectors", tok.Connectors)
			svc := &intent.Service{Pool: pool, Policy: policy}
			err = mcpserver.ServeStdio(ctx, svc, tok, e.stdin, e.stdout,
				&mcpserver.Config{Logger: logger, Version: buildVersion()})
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				// A signal (or the caller) ended the session: a normal stop.
				return nil
			}
			if err != nil {
				return fmt.Errorf("mcp: %w", err)
			}
			return nil
		},
	}
	db.register(cmd)
	return cmd
}

// sessionRefused says err is PostgreSQL refusing to open a session that no later attempt
// would get either: the role or its password refused (class 28, invalid authorization
// specification), or the database unknown (3D000, invalid catalog name).
func sessionRefused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, new(*pgconn.ConnectError)) || !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000"
}
