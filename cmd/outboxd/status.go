package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/ops"
)

// statusWatchInterval is how often status --watch refreshes.
const statusWatchInterval = 2 * time.Second

// statusReadTimeout bounds each read of status --watch.
const statusReadTimeout = opsConnectTimeout

// errNoAnswer is the failure of a status --watch read that got no answer in time.
var errNoAnswer = fmt.Errorf("the database did not answer within %s", statusReadTimeout)

// clearScreen moves the cursor home and clears the terminal (ANSI).
const clearScreen = "\x1b[H\x1b[2J"

func newStatusCmd(e *env) *cobra.Command {
	var (
		db     dbFlag
		asJSON bool
		watch  bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Summarise the outbox per connector, with a verdict",
		Long: "status prints a one-line verdict (healthy, backlog growing, dead letters, rows stuck), then one " +
			"row per connector instance: rows by status, the age of the oldest pending row, stuck, held and " +
			"ambiguous rows, rows that went dead in the last hour and day, and the receiver's guarantee when " +
			"the connector's OUTBOX_* variables are set (\"-\" otherwise, and for every connector when the " +
			"variables do not load, which a warning on stderr explains). A second line names the connectors " +
			"with pending or stuck rows that no running relay has (--json: relay_running).",
		Example: `  outboxd status
  outboxd status --json | jq .verdict
  outboxd status --watch    # refresh every 2s until Ctrl-C`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if watch && asJSON {
				return usagef("--watch and --json do not go together")
			}
			ctx := cmd.Context()
			pool, err := db.open(ctx, e)
			if err != nil {
				return err
			}
			defer pool.Close()
			dsn, _ := db.resolve(e)
			g := guarantees(e, dsn).of
			if !watch {
				rep, err := ops.Status(ctx, pool, time.Time{})
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(e.stdout, statusJSON(rep, g))
				}
				return writeStatus(e.stdout, rep, g)
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			return watchStatus(ctx, e.stdout, func(ctx context.Context) (ops.Report, error) {
				// Bounded, as connecting is: a connection the network dropped without a
				// word (a failover that moved the database's address, a NAT gateway that
				// forgot it) waited for the answer until TCP keepalive gave up, most of an
				// hour, with the screen frozen on the last status. pgx closes the
				// connection at the deadline, and the next read makes a new one.
				ctx, cancel := context.WithTimeoutCause(ctx, statusReadTimeout, errNoAnswer)
				defer cancel()
				rep, err := ops.Status(ctx, pool, time.Time{})
				if err != nil && errors.Is(context.Cause(ctx), errNoAnswer) {
					return rep, errNoAnswer
				}
				return rep, err
			}, g)
		},
	}
	db.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "refresh in place every 2s until interrupted")
	return cmd
}

// watchStatus prints the status, clearing the screen first, every statusWatchInterval
// until ctx ends, which is a normal end. A read that fails is shown in place of the
// status and the watch goes on: it ended the watch, which an operator keeps open while
// the database restarts or fails over, the moment it did.
func watchStatus(ctx context.Context, w io.Writer, read func(context.Context) (ops.Report, error),
	g map[string]connectors.Guarantee) error {
	ticker := time.NewTicker(statusWatchInterval)
	defer ticker.Stop()
	for {
		rep, err := read(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var b strings.Builder
		b.WriteString(clearScreen)
		at := rep.Now
		if err != nil {
			fmt.Fprintf(&b, "could not read the status: %s\n", printable(err.Error()))
			at = time.Now() // no report: when the read failed, by this machine's clock
		} else if err := writeStatus(&b, rep, g); err != nil {
			return err
		}
		fmt.Fprintf(&b, "\nrefreshing every %s at %s; Ctrl-C to stop\n", statusWatchInterval, at.UTC().Format("15:04:05Z"))
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// statusConnectorJSON is a connector's status with its guarantee.
type statusConnectorJSON struct {
	ops.ConnectorStatus
	// Guarantee is empty when the configuration does not say.
	Guarantee string `json:"guarantee"`
}

type statusReportJSON struct {
	Verdict    string                `json:"verdict"`
	Now        time.Time             `json:"now"`
	Connectors []statusConnectorJSON `json:"connectors"`
}

func statusJSON(rep ops.Report, g map[string]connectors.Guarantee) statusReportJSON {
	out := statusReportJSON{Verdict: rep.Verdict, Now: rep.Now, Connectors: []statusConnectorJSON{}}
	for _, c := range rep.Connectors {
		out.Connectors = append(out.Connectors, statusConnectorJSON{ConnectorStatus: c, Guarantee: string(g[c.Connector])})
	}
	return out
}

// writeStatus prints the verdict line and the table, one row per connector.
func writeStatus(w io.Writer, rep ops.Report, g map[string]connectors.Guarantee) error {
	var (
		attention []string
		awaiting  int
		noRelay   []string
	)
	for _, c := range rep.Connectors {
		if c.Verdict != ops.VerdictHealthy {
			attention = append(attention, c.Connector+": "+c.Verdict)
		}
		awaiting += c.Counts.AwaitingApproval
		if c.WaitsForARelay() {
			var waiting []string
			if c.Counts.Pending > 0 {
				waiting = append(waiting, fmt.Sprintf("%d pending", c.Counts.Pending))
			}
			if c.Stuck > 0 {
				waiting = append(waiting, fmt.Sprintf("%d stuck", c.Stuck))
			}
			noRelay = append(noRelay, fmt.Sprintf("%s (%s)", c.Connector, strings.Join(waiting, ", ")))
		}
	}
	// Intents awaiting approval leave the verdict as it is (they wait for a person by
	// design, not for a repair), but the line says so: "nothing needs attention" read
	// wrong to the person they wait for.
	approvals := ""
	if awaiting > 0 {
		approvals = fmt.Sprintf("; %d intent(s) await approval (outboxd list --status awaiting_approval)", awaiting)
	}
	switch {
	case len(rep.Connectors) == 0:
		fmt.Fprintf(w, "%s: the outbox is empty\n", rep.Verdict)
	case len(attention) == 0 && (awaiting > 0 || len(noRelay) > 0):
		fmt.Fprintf(w, "%s: %d connector(s)%s\n", rep.Verdict, len(rep.Connectors), approvals)
	case len(attention) == 0:
		fmt.Fprintf(w, "%s: %d connector(s), nothing needs attention\n", rep.Verdict, len(rep.Connectors))
	default:
		fmt.Fprintf(w, "%s: %s%s\n", rep.Verdict, strings.Join(attention, "; "), approvals)
	}
	if len(noRelay) > 0 {
		// Never dead, never lost: they wait, and a verdict of backlog comes only once a
		// due row has waited a minute (a row scheduled later, never).
		fmt.Fprintf(w, "no running relay has %s: their rows wait until a relay with them runs\n",
			strings.Join(noRelay, "; "))
	}
	if len(rep.Connectors) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := newTable(w)
	fmt.Fprintln(tw, "CONNECTOR\tGUARANTEE\tPENDING\tDELIVERING\tDELIVERED\tDEAD\tCANCELED\tAWAITING\tHELD\t"+
		"OLDEST PENDING\tSTUCK\tAMBIGUOUS\tDEAD 1H\tDEAD 24H\tVERDICT")
	n := strconv.Itoa
	for _, c := range rep.Connectors {
		k := c.Counts
		fmt.Fprintln(tw, strings.Join([]string{
			c.Connector, guaranteeCell(g, c.Connector),
			n(k.Pending), n(k.Delivering), n(k.Delivered), n(k.Dead), n(k.Canceled), n(k.AwaitingApproval), n(k.Held),
			age(c.OldestPendingAge), n(c.Stuck), n(c.Ambiguous), n(c.DeadLastHour), n(c.DeadLastDay), c.Verdict,
		}, "\t"))
	}
	return tw.Flush()
}
