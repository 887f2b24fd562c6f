package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

func newEnqueueCmd(e *env) *cobra.Command {
	var (
		db                                        dbFlag
		connector, key, payload, orderingKey, nbf string
		asJSON                                    bool
	)
	cmd := &cobra.Command{
		Use:   "enqueue",
		Short: "Write one intent to the outbox",
		Long: "enqueue writes an intent as outbox.Enqueue does in an application's transaction, with the same " +
			"validation and idempotency: enqueueing the same key with the same request again is harmless and " +
			"says \"already enqueued\"; the same key with a different request is a conflict and exits 1, and a " +
			"message the connector's kind would refuse (a payload that is not valid JSON, say) is bad usage and exits 2.\n\n" +
			"--payload is JSON text, @FILE to read it from a file, or - to read it from stdin.",
		Example: `  outboxd enqueue --connector webhook --key order-42-shipped --payload '{"order": 42, "event": "shipped"}'
  outboxd enqueue --connector email --key welcome-7 --payload @welcome.json --not-before 2030-01-01T09:00:00Z
  jq -n '{channel: "C0123OPS", text: "deploy done"}' | outboxd enqueue --connector slack --key deploy-991 --payload -`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, name := range []string{"connector", "key", "payload"} {
				if !cmd.Flags().Changed(name) {
					return usagef("enqueue needs --%s", name)
				}
			}
			// Given empty (--ordering-key "$CUSTOMER", unset), they would be taken for
			// no flag: an intent without its ordering key, free to go out before the
			// earlier rows of that key, or due at once instead of at its time.
			for _, given := range []struct{ name, value, without string }{
				{"ordering-key", orderingKey, "an intent without an ordering key"},
				{"not-before", nbf, "an intent due at once"},
			} {
				if given.value == "" && cmd.Flags().Changed(given.name) {
					return usagef("--%s is empty; leave it out for %s", given.name, given.without)
				}
			}
			m := outbox.Message{Connector: connector, Key: key, OrderingKey: orderingKey, CreatedBy: actor(e)}
			if nbf != "" {
				t, err := time.Parse(time.RFC3339, nbf)
				if err != nil {
					return usagef("--not-before: %q is not an RFC 3339 time such as 2030-01-01T09:00:00Z", nbf)
				}
				m.NotBefore = t
			}
			body, err := readPayload(e, payload)
			if err != nil {
				return err
			}
			m.Payload = json.RawMessage(body)
			ctx := cmd.Context()
			pool, err := db.open(ctx, e)
			if err != nil {
				return err
			}
			defer pool.Close()
			in, err := outbox.Enqueue(ctx, pool, m)
			if errors.Is(err, outbox.ErrInvalidMessage) {
				// Refused before anything was sent: the flags are at fault, as a bad
				// --not-before is, and running the command again cannot help.
				return usageError{err}
			}
			if err != nil {
				return err
			}
			if asJSON {
				// A key already there answers with its row, whose headers the caller may not have
				// written: shown as the intent API shows them.
				return writeJSON(e.stdout, enqueueJSON{Intent: ops.WithoutCredentials(in), Inserted: in.Inserted})
			}
			verb := "enqueued"
			if !in.Inserted {
				verb = "already enqueued"
			}
			next := "-" // as in inspect: only a row waiting to be sent has a next attempt
			if in.Status == outbox.StatusPending || in.Status == outbox.StatusAwaitingApproval {
				next = stamp(in.NextAttemptAt)
			}
			fmt.Fprintf(e.stdout, "%s %s (id %d, connector %s, status %s, next attempt %s)\n",
				verb, keyText(in.Key), in.ID, in.Connector, in.Status, next)
			return nil
		},
	}
	db.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&connector, "connector", "", "connector instance that delivers it: webhook, email, slack, payment, webhook:crm (required)")
	fs.StringVar(&key, "key", "", "idempotency key, derived from the work (required)")
	fs.StringVar(&payload, "payload", "", "JSON payload, @FILE, or - for stdin (required)")
	fs.StringVar(&orderingKey, "ordering-key", "", "rows sharing it are delivered one at a time in enqueue order")
	fs.StringVar(&nbf, "not-before", "", "first attempt no earlier than this RFC 3339 time")
	fs.BoolVar(&asJSON, "json", false, "print the intent as JSON")
	return cmd
}

type enqueueJSON struct {
	outbox.Intent
	Inserted bool `json:"inserted"`
}

// readPayload returns the payload text: the flag's value, a file's content (@FILE) or
// stdin (-).
func readPayload(e *env, v string) ([]byte, error) {
	switch {
	case v == "-":
		b, err := io.ReadAll(e.stdin)
		if err != nil {
			return nil, fmt.Errorf("read payload from stdin: %w", err)
		}
		return b, nil
	case strings.HasPrefix(v, "@"):
		b, err := os.ReadFile(v[1:])
		if err != nil {
			// A file missing, unreadable or a directory: the flag is at fault, as a
			// bad --not-before is, and running the command again cannot help.
			return nil, usagef("--payload %s: %v", v, err)
		}
		return b, nil
	default:
		return []byte(v), nil
	}
}
