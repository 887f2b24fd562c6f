package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/intent"
)

func newTokenCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "token",
		Short:   "Manage intent API tokens",
		Example: `  outboxd token new --name agent --connectors webhook:crm,slack`,
		Args:    noArgs,
	}
	cmd.AddCommand(newTokenNewCmd(e))
	return cmd
}

func newTokenNewCmd(e *env) *cobra.Command {
	var (
		name       string
		connectors []string
		admin      bool
	)
	cmd := &cobra.Command{
		Use:   "new --name NAME --connectors LIST [--admin]",
		Short: "Make a new intent API token",
		Long: "token new makes a random token and prints it once, with the entry to add to the JSON " +
			"array in OUTBOX_API_TOKENS. outboxd stores only the token's SHA-256, so keep the token " +
			"itself in the client's secret store: it cannot be shown again.\n\n" +
			"--connectors lists the connector instances the token may use: webhook, webhook:crm, " +
			"webhook:* (every webhook instance) or * (all). --admin lets it approve, reject and cancel.",
		Example: `  outboxd token new --name support-agent --connectors webhook:crm,slack
  outboxd token new --name ops --connectors '*' --admin`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" || len(connectors) == 0 {
				return usagef("%s needs --name and --connectors", cmd.CommandPath())
			}
			var conns []string
			for _, c := range connectors {
				if c = strings.TrimSpace(c); c != "" {
					conns = append(conns, c)
				}
			}
			secret, sum, err := intent.NewToken()
			if err != nil {
				return err
			}
			tok := intent.Token{Name: name, SHA256: sum, Connectors: conns, Admin: admin}
			entry, err := json.Marshal([]intent.Token{tok})
			if err != nil {
				return err
			}
			// The same checks as at start, so the entry printed is one serve accepts.
			if _, err := intent.ParseTokens(string(entry)); err != nil {
				return usagef("%v", strings.ReplaceAll(err.Error(), "\n", "; "))
			}
			line, _ := json.Marshal(tok) // encoded just above
			fmt.Fprintf(e.stdout, "token: %s\n", secret)
			fmt.Fprintln(e.stdout, "Keep it in the client's secret store; it is not shown again.")
			fmt.Fprintln(e.stdout, "Add this entry to the JSON array in OUTBOX_API_TOKENS:")
			fmt.Fprintf(e.stdout, "%s\n", line)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the token's name, shown as created_by and in the audit trail (required)")
	cmd.Flags().StringSliceVar(&connectors, "connectors", nil, "connector instances the token may use, comma-separated (required)")
	cmd.Flags().BoolVar(&admin, "admin", false, "let the token approve, reject and cancel intents")
	return cmd
}
