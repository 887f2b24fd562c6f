package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
	"github.com/outboxd/outboxd/internal/config"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// This file holds what the operator commands (status, list, inspect, replay, cancel,
// purge, enqueue) share: the database flag, the pool, JSON and table output, the list
// filters, the actor and the connector guarantees. The commands only parse and print;
// every query is in internal/ops or the outbox package.

// dbFlag is the --database-url flag every operator command has; it wins over
// OUTBOX_DATABASE_URL.
type dbFlag struct {
	url string
	cmd *cobra.Command
}

func (f *dbFlag) register(cmd *cobra.Command) {
	f.cmd = cmd
	cmd.Flags().StringVar(&f.url, "database-url", "",
		"PostgreSQL DSN (default: $OUTBOX_DATABASE_URL); it may hold a password, so prefer the variable")
}

// resolve returns the DSN to use: the flag, else OUTBOX_DATABASE_URL. A missing DSN is a
// usage error, and so is the flag given empty (--database-url "$STAGING_URL", unset):
// taken for no flag, it would point a purge or a replay meant for one database at
// another. White space alone is empty too, as in OUTBOX_DATABASE_URL: pgx reads it as a
// DSN that sets nothing, the local server's default database.
func (f *dbFlag) resolve(e *env) (string, error) {
	if strings.TrimSpace(f.url) != "" {
		return f.url, nil
	}
	if f.cmd != nil && f.cmd.Flags().Changed("database-url") {
		return "", usagef("--database-url is empty; leave it out to use OUTBOX_DATABASE_URL")
	}
	db, err := config.LoadDatabase(e.environ)
	if err != nil {
		return "", usageError{fmt.Errorf("%w (or pass --database-url)", err)}
	}
	return db.URL, nil
}

// opsConnectTimeout bounds each connection attempt of the operator commands, unless the
// DSN sets connect_timeout.
const opsConnectTimeout = 10 * time.Second

// boundConnect gives cfg's connections opsConnectTimeout unless its DSN set one: pgx
// waits for ever without one, and a database that accepts connections and never answers
// (a hung server, a stalled network path) would hang the command.
func boundConnect(cfg *pgxpool.Config) {
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = opsConnectTimeout
	}
}

// open returns a small pool on the database, as openPool does, once the database is
// known to have the outbox schema (see checkSchema).
func (f *dbFlag) open(ctx context.Context, e *env) (*pgxpool.Pool, error) {
	pool, err := f.openPool(ctx, e)
	if err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// errNoSchema is the failure of a command on a database nobody has migrated.
var errNoSchema = errors.New("the database has no outbox schema: run outboxd migrate first")

// checkSchema returns errNoSchema when the database has no outbox schema: on one nobody
// migrated, every command failed with PostgreSQL's `relation "outbox" does not exist`,
// which does not say what to do (and cancel printed an empty result first). An older
// schema is not refused here: the commands ran on it before, and migrate is what
// upgrades it.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	version, err := outboxd.AppliedVersion(ctx, pool)
	var (
		pgErr   *pgconn.PgError
		connErr *pgconn.ConnectError
	)
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		// A role with the README's operator grants may not read
		// outbox_schema_migrations; that it exists says the schema does.
		return nil
	case errors.As(err, &connErr):
		// pgx's "failed to connect to ..." says it all; "read schema version" would
		// only puzzle.
		return connErr
	case err != nil:
		return err
	case version == 0:
		return errNoSchema
	}
	return nil
}

// openPool returns a small pool on the database: the commands run a few statements each.
// It does not connect: the first statement does.
func (f *dbFlag) openPool(ctx context.Context, e *env) (*pgxpool.Pool, error) {
	dsn, err := f.resolve(e)
	if err != nil {
		return nil, err
	}
	cfg, err := config.ParseDSN("--database-url", dsn)
	if err != nil {
		return nil, usageError{err}
	}
	if cfg.MaxConns > 4 {
		cfg.MaxConns = 4
	}
	boundConnect(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database pool: %w", err)
	}
	return pool, nil
}

// writeJSON prints v as indented JSON, with the characters a terminal would act on
// escaped (see jsonEscaped).
func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(jsonEscaped(b.Bytes()))
	return err
}

// jsonEscaped writes the characters of JSON text js that are not graphic, other than
// its line breaks and indentation, as \u escapes, which mean the same characters. JSON
// and jsonb escape only those below U+0020; a receiver's answer or a payload may also
// hold C1 controls (U+009B starts an escape sequence on some terminals), DEL or format
// characters (U+202E makes the text after it read backwards). Outside strings, valid
// JSON holds no such character.
func jsonEscaped(js []byte) []byte {
	if bytes.IndexFunc(js, func(r rune) bool { return notGraphic(r) && r != '\n' && r != ' ' }) < 0 {
		return js
	}
	var b bytes.Buffer
	for _, r := range string(js) {
		if !notGraphic(r) || r == '\n' || r == ' ' {
			b.WriteRune(r)
			continue
		}
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			fmt.Fprintf(&b, "\\u%04x\\u%04x", r1, r2)
		} else {
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.Bytes()
}

// newTable returns a tabwriter for aligned columns; Flush it when done.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// cell makes s fit one table cell: one line of printable text (see printable), at most
// n runes, "-" when empty.
func cell(s string, n int) string {
	s = printable(strings.Join(strings.Fields(s), " "))
	if s == "" {
		return "-"
	}
	return truncate(s, n)
}

// truncate cuts s to at most n runes, marking a cut with "…"; n <= 0 keeps it whole.
func truncate(s string, n int) string {
	if n > 0 && utf8.RuneCountInString(s) > n {
		r := []rune(s)
		return string(r[:n-1]) + "…"
	}
	return s
}

// printable replaces each character a terminal would act on instead of showing it
// (control characters such as ESC, which starts an escape sequence, and invisible
// format characters such as a right-to-left override) by its Go escape, \x1b or
// \u202e. Stored text comes from applications, plain SQL and receivers' answers (a
// row's last error), and must not clear, retitle or redraw the operator's terminal.
func printable(s string) string {
	if strings.IndexFunc(s, notGraphic) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if notGraphic(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func notGraphic(r rune) bool { return !unicode.IsGraphic(r) }

// keyText shows an idempotency key (or an ordering key) so that a person can read it
// back exactly: as it is when it is all printable characters without white space, else
// quoted as a Go string ("order  42", "evil\x1b[2J"), which a table does not collapse
// into another key and a terminal does not act on. A key that starts with a quote is
// quoted too, so that it is not taken for the quoted form of another, and so is "-",
// which the tables show for an empty cell (inspect's "ordering key: -" for none).
func keyText(s string) string {
	if s == "" || s == "-" || strings.HasPrefix(s, `"`) ||
		strings.IndexFunc(s, func(r rune) bool { return notGraphic(r) || unicode.IsSpace(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// age formats a duration for a person, to the second; "-" for zero.
func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// stamp formats a time in UTC, to the second; "-" for zero.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// actor names who runs a command that changes rows, for the audit trail: $USER, or
// "cli".
func actor(e *env) string {
	u := "cli"
	for _, kv := range e.environ {
		if v, ok := strings.CutPrefix(kv, "USER="); ok && strings.TrimSpace(v) != "" {
			u = v // the last one wins, as in the process environment
		}
	}
	return u
}

// opsError turns the library's refusals of a filter or options into usage errors.
func opsError(err error) error {
	if errors.Is(err, ops.ErrInvalidFilter) || errors.Is(err, ops.ErrInvalidOptions) {
		return usageError{err}
	}
	return err
}

// filterFlags are the filters list and replay share.
type filterFlags struct {
	status        []string
	connector     string
	keyPrefix     string
	olderThan     time.Duration
	newerThan     time.Duration
	errorContains string
	orderingKey   string
	limit         int
	limitMax      int // list's page size; 0: replay's cap, which has no maximum
	after         string
}

// register adds the filter flags; paging (list) adds --after and makes --limit the page
// size, at most ops.MaxListLimit; limitDefault is --limit's default (0: no cap).
func (f *filterFlags) register(cmd *cobra.Command, paging bool, limitDefault int, limitHelp string) {
	fs := cmd.Flags()
	if paging {
		f.limitMax = ops.MaxListLimit
	}
	fs.StringSliceVar(&f.status, "status", nil,
		"keep rows in these statuses, repeated or comma-separated: "+strings.Join(ops.Statuses, ", "))
	fs.StringVar(&f.connector, "connector", "", "keep rows of this connector instance (webhook, webhook:crm)")
	fs.StringVar(&f.keyPrefix, "key-prefix", "", "keep rows whose idempotency key starts with this text")
	fs.DurationVar(&f.olderThan, "older-than", 0, "keep rows created more than this long ago (e.g. 1h, 30m)")
	fs.DurationVar(&f.newerThan, "newer-than", 0, "keep rows created less than this long ago")
	fs.StringVar(&f.errorContains, "error-contains", "", "keep rows whose last error contains this text, ignoring case")
	fs.StringVar(&f.orderingKey, "ordering-key", "", "keep rows with this ordering key")
	fs.IntVar(&f.limit, "limit", limitDefault, limitHelp)
	if paging {
		fs.StringVar(&f.after, "after", "", "cursor of the page to show, from a previous \"next page\" line")
	}
}

// set says whether any filter (not --limit or --after) was given.
func (f *filterFlags) set(cmd *cobra.Command) bool {
	for _, name := range []string{"status", "connector", "key-prefix", "older-than", "newer-than",
		"error-contains", "ordering-key"} {
		if cmd.Flags().Changed(name) {
			return true
		}
	}
	return false
}

// filter returns the ops.Filter; statuses are trimmed and lowercased, and a negative
// duration or limit is a usage error here rather than in the library. So is a filter
// given with an empty value (--connector "$UNSET"), which the library takes for no
// filter: replay would select the rows of every connector.
func (f *filterFlags) filter(cmd *cobra.Command) (ops.Filter, error) {
	for _, given := range []struct{ name, value string }{
		{"status", strings.Trim(strings.Join(f.status, ","), " ,")}, {"connector", f.connector},
		{"key-prefix", f.keyPrefix}, {"error-contains", f.errorContains}, {"ordering-key", f.orderingKey},
	} {
		if given.value == "" && cmd.Flags().Changed(given.name) {
			return ops.Filter{}, usagef("--%s is empty; leave it out to select rows whatever their %s",
				given.name, strings.ReplaceAll(given.name, "-", " "))
		}
	}
	if f.connector != "" && !outbox.ValidConnectorName(f.connector) {
		// No row can have it (the table's constraint): a typo, not an empty selection.
		return ops.Filter{}, usagef("--connector: %q is not a connector instance such as webhook or webhook:crm "+
			"(lowercase letters, digits and '_')", f.connector)
	}
	if f.olderThan < 0 {
		return ops.Filter{}, usagef("--older-than: %s is negative", f.olderThan)
	}
	if f.newerThan < 0 {
		return ops.Filter{}, usagef("--newer-than: %s is negative", f.newerThan)
	}
	if f.newerThan == 0 && cmd.Flags().Changed("newer-than") {
		// Created less than no time ago: no row. The library takes a zero age for no
		// filter, and replay would select rows of every age (--newer-than "${N}m", N=0).
		return ops.Filter{}, usagef("--newer-than %s selects no row; leave it out to select rows whatever their age",
			f.newerThan)
	}
	if f.olderThan > 0 && f.newerThan > 0 && f.olderThan >= f.newerThan {
		// Created before one time and after a later one: no row, ever (the flags swapped).
		return ops.Filter{}, usagef("--older-than %s --newer-than %s selects no row; rows created between %s and %s ago "+
			"are --older-than %[3]s --newer-than %[4]s", f.olderThan, f.newerThan,
			min(f.olderThan, f.newerThan), max(f.olderThan, f.newerThan))
	}
	if err := f.checkLimit(cmd); err != nil {
		return ops.Filter{}, err
	}
	var statuses []string
	for _, s := range f.status {
		if s = strings.ToLower(strings.TrimSpace(s)); s != "" {
			statuses = append(statuses, s)
		}
	}
	return ops.Filter{
		Status: statuses, Connector: f.connector, KeyPrefix: f.keyPrefix,
		OlderThan: f.olderThan, NewerThan: f.newerThan, ErrorContains: f.errorContains,
		OrderingKey: f.orderingKey, Limit: f.limit, After: f.after,
	}, nil
}

// checkLimit refuses a --limit outside what the command takes, naming the range. The
// library reads a zero limit as its default (a page of 50 for list, no cap for replay),
// so --limit 0 listed 50 rows and would have replayed every row the filters match, where
// an operator who types it means none: a typo or an empty variable, as --newer-than 0 is.
// And list caps its pages at ops.MaxListLimit: --limit 5000 showed 1000 rows, the next
// page's cursor easy to miss in a script.
func (f *filterFlags) checkLimit(cmd *cobra.Command) error {
	switch {
	case f.limitMax > 0 && (f.limit < 1 || f.limit > f.limitMax):
		return usagef("--limit: %d is not between 1 and %d rows a page; follow \"next page\" for more", f.limit, f.limitMax)
	case f.limitMax == 0 && f.limit < 1 && cmd.Flags().Changed("limit"):
		return usagef("--limit: %d is not a number of rows (1 or more); leave it out to select every row the filters match",
			f.limit)
	}
	return nil
}

// guaranteeSet is what the configuration says of connector instances' receivers.
type guaranteeSet struct {
	// of maps connector instances ("webhook", "webhook:crm") to their receiver's guarantee.
	of map[string]connectors.Guarantee
	// unknownWhy says why an instance not in of has no known guarantee, for the notes.
	unknownWhy string
}

// guarantees returns the guarantees of the connector instances the configuration in e's
// environment has. A configuration that does not load (missing or invalid variables, of
// any instance or of the engine) gives none: the guarantee is then unknown, which no
// command fails for, and a warning on e's stderr names the problems, as serve would.
// Without it, an operator who had set an instance's variables read "-" and "its
// OUTBOX_* variables are not set", and looked for the mistake in the wrong place. dsn
// fills in OUTBOX_DATABASE_URL, which config.Load requires, when it came from
// --database-url.
func guarantees(e *env, dsn string) guaranteeSet {
	cfg, err := loadConfig(e.environ, dsn)
	if err != nil {
		// One line per problem, as serve prints them; each one's text made printable.
		lines := strings.Split(strings.TrimPrefix(err.Error(), "invalid configuration:"), "\n")
		for i := range lines {
			lines[i] = printable(lines[i])
		}
		fmt.Fprintf(e.stderr, "outboxd: warning: no receiver's guarantee is known here, as the OUTBOX_* "+
			"variables do not load (serve would refuse them too):%s\n", strings.Join(lines, "\n"))
		return guaranteeSet{of: map[string]connectors.Guarantee{}, unknownWhy: "the OUTBOX_* variables here do not load"}
	}
	out := make(map[string]connectors.Guarantee)
	for _, w := range cfg.Webhooks {
		out[w.Instance()] = w.Guarantee
	}
	for _, p := range cfg.Payments {
		out[p.Instance()] = connectors.Enforced // Stripe dedupes on Idempotency-Key
	}
	for _, s := range cfg.Slacks {
		out[s.Instance()] = connectors.Reconciled // looks for the message before posting
	}
	for _, m := range cfg.Emails {
		// SMTP: the Message-ID derives from the key, but nothing is known to dedupe on it.
		// Resend dedupes on the Idempotency-Key header.
		out[m.Instance()] = connectors.Forwarded
		if m.Transport == config.EmailTransportResend {
			out[m.Instance()] = connectors.Enforced
		}
	}
	return guaranteeSet{of: out, unknownWhy: "its OUTBOX_* variables are not set"}
}

// loadConfig loads the configuration in environ, with dsn as OUTBOX_DATABASE_URL, which
// config.Load requires, when it came from --database-url.
func loadConfig(environ []string, dsn string) (*config.Config, error) {
	return config.Load(append(environ[:len(environ):len(environ)], "OUTBOX_DATABASE_URL="+dsn))
}

// keyWindows returns replay's ops.ReplayOptions.KeyWindowFunc: the key window of each
// connector instance whose receiver enforces keys for a while only, and the longest its
// attempts last, as a relay built from the configuration in environ has them (the same
// connectors, the same lease). A payment instance this configuration does not have (or
// one that does not load) has Stripe's window all the same, which no configuration
// changes, with attempts taken as instant: the replay then refuses only rows whose window
// has surely passed. An email instance's window depends on its transport, which only the
// configuration says.
func keyWindows(environ []string, dsn string) func(connector string) ops.KeyWindow {
	known := map[string]ops.KeyWindow{}
	if cfg, err := loadConfig(environ, dsn); err == nil {
		if instances, err := buildInstances(cfg); err == nil {
			for name, in := range instances {
				if in.Connector.Guarantee() == connectors.Enforced {
					known[name] = ops.KeyWindow{Window: connectors.KeyWindow(in.Connector),
						AttemptMax: relay.AttemptMax(in.Connector, cfg.Engine.Lease)}
				}
			}
		}
	}
	return func(connector string) ops.KeyWindow {
		if w, ok := known[connector]; ok {
			return w
		}
		if kind, _, _ := strings.Cut(connector, ":"); kind == "payment" {
			return ops.KeyWindow{Window: payment.StripeKeyWindow}
		}
		return ops.KeyWindow{}
	}
}

// guaranteeCell shows a connector's guarantee, "-" when unknown.
func guaranteeCell(g map[string]connectors.Guarantee, connector string) string {
	if v, ok := g[connector]; ok && v != "" {
		return string(v)
	}
	return "-"
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// stdinTerminal says whether stdin is an interactive terminal; stdin that is not an
// *os.File (tests, pipes wrapped in readers) is not.
func stdinTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && isTerminal(f)
}

// stderrTerminal says whether w is an interactive terminal, for progress output.
func stderrTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}

// writeLeftAlone prints the keys a cancel or replay did not change: those already as
// wanted (with why(key), in parentheses), those it refused, and those no intent has.
func writeLeftAlone(w io.Writer, unchanged []string, why func(key string) string, refused map[string]string, notFound []string) {
	fmt.Fprintf(w, "unchanged: %d\n", len(unchanged))
	for _, k := range unchanged {
		fmt.Fprintf(w, "  %s (%s)\n", keyText(k), why(k))
	}
	fmt.Fprintf(w, "refused: %d\n", len(refused))
	for _, k := range sortedKeys(refused) {
		fmt.Fprintf(w, "  %s: %s\n", keyText(k), printable(refused[k]))
	}
	if len(notFound) > 0 {
		fmt.Fprintf(w, "not found: %d\n", len(notFound))
		for _, k := range notFound {
			fmt.Fprintf(w, "  %s: no intent has this key\n", keyText(k))
		}
	}
}

// keysLeftError is the error of a cancel or replay (verb: "canceled", "replayed") that
// did not find or was refused some of the keys given, or nil.
func keysLeftError(verb string, notFound []string, refused map[string]string) error {
	if len(notFound) == 0 && len(refused) == 0 {
		return nil
	}
	n := len(notFound) + len(refused)
	were := "were"
	if n == 1 {
		were = "was"
	}
	return fmt.Errorf("%d of the keys given %s not %s (%d not found, %d refused)",
		n, were, verb, len(notFound), len(refused))
}
