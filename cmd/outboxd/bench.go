package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/config"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgcluster"
	"github.com/outboxd/outboxd/internal/proccpu"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// benchOptions are bench's flags.
type benchOptions struct {
	rows         int
	payloadBytes int
	concurrency  int
	batchSize    int
	rate         float64
	duration     time.Duration
	json         bool
	cpuProfile   string
	producers    int
}

// Bounds of the benchmark's steps, so that a stuck run ends with an error instead of
// hanging. They are far above what a healthy run takes.
const (
	benchSetupTimeout = 2 * time.Minute  // cluster, databases, migrations
	benchPhaseTimeout = 5 * time.Minute  // each measured phase, inserts included
	benchLatencyDrain = 30 * time.Second // after the offered load, for the last deliveries
	benchInsertBatch  = 1000             // rows per EnqueueBatch while pre-inserting
	benchMaxProducers = 64
	// benchRowsPerProducer is the offered rows/s one producer goroutine is given. More
	// producers do not commit faster: PostgreSQL serializes the commits of transactions
	// that NOTIFY (schema.sql's insert trigger does), and more of them only queue on
	// that lock.
	benchRowsPerProducer = 125
	// benchRetention is the relays' retention: far beyond a run, so that a bench relay
	// on a shared database never purges rows that the database's own relays keep longer.
	benchRetention = 100 * 365 * 24 * time.Hour
	// benchRateReached is the share of the offered rate the producers must reach for
	// the latency targets to count as met at that rate.
	benchRateReached = 0.95
	// benchMaxDuration bounds --duration: the latency phase's own bound is
	// benchPhaseTimeout beyond it, which must not overflow a time.Duration.
	benchMaxDuration = 24 * time.Hour
)

// Targets from the performance issue, shown beside the figures. They are meant for the
// default flags on the 2-core reference machine.
const (
	targetDeliveriesPerSec = 15000
	targetRelayToRaw       = 0.5
	targetP50              = 5 * time.Millisecond
	targetP99              = 25 * time.Millisecond
)

// benchStatusSQL counts one connector instance's rows by status, with their attempts, to
// check after the throughput phase that every row was delivered, and how many retries
// it took. The bench command's only reads of the table; the outbox package has no
// counting function yet.
const benchStatusSQL = `
SELECT status, count(*), coalesce(sum(attempts), 0)
FROM outbox
WHERE connector = $1
GROUP BY status`

// benchSettingsSQL reads the server settings the report shows, so the figures always
// say which durability they were measured with.
const benchSettingsSQL = `
SELECT current_setting('server_version'), current_setting('fsync'),
       current_setting('synchronous_commit'), current_setting('full_page_writes')`

func newBenchCmd(e *env) *cobra.Command {
	o := benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the relay's throughput and commit-to-delivery latency on loopback",
		Long: "bench measures the relay against a fast receiver on loopback that enforces Idempotency-Key. " +
			"It starts a throwaway PostgreSQL with durable commits (fsync=on, synchronous_commit=on) from the " +
			"local server binaries, or uses OUTBOX_DATABASE_URL, and runs three phases:\n\n" +
			"  1. raw: --rows keep-alive POSTs of the same payload straight to the receiver, from --concurrency " +
			"workers: the ceiling the relay is compared with. Half of them run right before phase 2 and half " +
			"right after it, and the raw rate is all of them over the time both halves took: the machine's " +
			"speed drifts over seconds, and a ratio of two phases measured one after the other would carry " +
			"that drift (either way), which bracketing phase 2 cancels while it is steady.\n" +
			"  2. throughput: a relay with --concurrency and --batch-size delivers --rows rows; the time from " +
			"its start until every row's outcome is recorded (each row's effect at the receiver, then the relay stopped, its outcomes written) gives deliveries/s. Every row must end delivered, with " +
			"exactly one effect. The rows are inserted before phase 1 and, in the throwaway cluster, every " +
			"connection of the pool reads the table once (neither is timed), so that phases 1 and 2 run back " +
			"to back.\n" +
			"  3. latency: a fresh relay, and --rate rows/s offered for --duration, each row in its own " +
			"transaction (BEGIN, outbox.Enqueue, COMMIT); commit-to-delivery is the time from COMMIT " +
			"returning to the request's arrival at the receiver. In the throwaway cluster it also reports the " +
			"CPU the phase cost per row, in this process and in PostgreSQL (the producers' connections apart), " +
			"how busy that kept the machine, and how long PostgreSQL's WAL flushes took, for which every " +
			"durable COMMIT waits.\n\n" +
			"Progress goes to stderr, the report to stdout (JSON with --json). With OUTBOX_DATABASE_URL the " +
			"rows stay in that database, under connector instances of their own (webhook:bench_<run id>_*); a bench " +
			"stopped before they finish cancels the ones left, which no relay would ever deliver.",
		Example: `  # the issue's benchmark: 50,000 rows of ~500 bytes, then 1,000 rows/s for 10s
  outboxd bench

  # a quick look, as JSON
  outboxd bench --rows 5000 --duration 3s --json

  # a bigger batch and fewer deliveries in flight
  outboxd bench --batch-size 1000 --concurrency 64`,
		RunE: func(cmd *cobra.Command, _ []string) error { return bench(cmd.Context(), e, o) },
	}
	f := cmd.Flags()
	f.IntVar(&o.rows, "rows", 50000, "rows delivered in the throughput phase (and raw POSTs in the raw phase)")
	f.IntVar(&o.payloadBytes, "payload-bytes", 500, "size of each webhook payload, in bytes of JSON")
	f.IntVar(&o.concurrency, "concurrency", 128, "deliveries in flight (the relay's Concurrency), and raw POST workers")
	f.IntVar(&o.batchSize, "batch-size", 1000, "most rows one claim takes (the relay's BatchSize)")
	f.Float64Var(&o.rate, "rate", 1000, "rows/s offered in the latency phase, each in its own transaction")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "how long the latency phase offers its load")
	f.BoolVar(&o.json, "json", false, "print the report as JSON")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the throughput phase to this file")
	_ = f.MarkHidden("cpuprofile")
	f.IntVar(&o.producers, "producers", 0, "goroutines committing the latency phase's transactions (default: one per 125 rows/s, 4 to 64)")
	_ = f.MarkHidden("producers")
	return cmd
}

func (o benchOptions) validate() error {
	var errs []error
	if o.rows < 1 {
		errs = append(errs, fmt.Errorf("--rows must be at least 1, got %d", o.rows))
	}
	if o.payloadBytes < 64 || o.payloadBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("--payload-bytes must be between 64 and 1048576, got %d", o.payloadBytes))
	}
	if o.concurrency < 1 {
		errs = append(errs, fmt.Errorf("--concurrency must be at least 1, got %d", o.concurrency))
	}
	if o.batchSize < 1 {
		errs = append(errs, fmt.Errorf("--batch-size must be at least 1, got %d", o.batchSize))
	}
	if !(o.rate > 0) || math.IsInf(o.rate, 0) {
		errs = append(errs, fmt.Errorf("--rate must be a positive number of rows/s, got %v", o.rate))
	}
	if o.producers < 0 {
		errs = append(errs, fmt.Errorf("--producers must not be negative, got %d", o.producers))
	}
	switch {
	case o.duration <= 0:
		errs = append(errs, fmt.Errorf("--duration must be positive, got %s", o.duration))
	case o.duration > benchMaxDuration:
		errs = append(errs, fmt.Errorf("--duration must be at most %s, got %s", benchMaxDuration, o.duration))
	}
	if o.rate > 0 && o.duration > 0 && o.rate*o.duration.Seconds() > 10_000_000 {
		errs = append(errs, errors.New("--rate × --duration must stay under 10,000,000 rows"))
	}
	// Less than a row offered, the phase would still send one, and report as achieved
	// that row over its own commit's time: a rate far above the one asked.
	if o.rate > 0 && o.duration > 0 && o.rate*o.duration.Seconds() < 1 {
		errs = append(errs, fmt.Errorf("--rate × --duration must give at least 1 row, got %g", o.rate*o.duration.Seconds()))
	}
	if len(errs) > 0 {
		return usageError{errors.Join(errs...)}
	}
	return nil
}

// benchReport is what bench measured, as printed with --json.
type benchReport struct {
	Config struct {
		Rows         int     `json:"rows"`
		PayloadBytes int     `json:"payload_bytes"`
		Concurrency  int     `json:"concurrency"`
		BatchSize    int     `json:"batch_size"`
		Rate         float64 `json:"rate"`
		Duration     string  `json:"duration"`
	} `json:"config"`
	Postgres struct {
		Source            string `json:"source"`
		Version           string `json:"version"`
		Fsync             string `json:"fsync"`
		SynchronousCommit string `json:"synchronous_commit"`
		FullPageWrites    string `json:"full_page_writes"`
		// VolatileStorage is the in-memory file system (tmpfs, ramfs) the throwaway
		// cluster's data directory is on, where fsync reaches no disk; "" otherwise.
		VolatileStorage string `json:"volatile_storage,omitempty"`
	} `json:"postgres"`
	Machine struct {
		CPUs       int    `json:"cpus"`
		GOMAXPROCS int    `json:"gomaxprocs"`
		Platform   string `json:"platform"`
		Go         string `json:"go"`
		// GC is the garbage collector's GOGC and GOMEMLIMIT, as serve sets them.
		GC string `json:"gc"`
	} `json:"machine"`
	// Raw is phase 1 as a whole: both halves together.
	Raw struct {
		rawResult
		// Halves are the part before phase 2 and the part after it.
		Halves []rawResult `json:"halves"`
	} `json:"raw"`
	Throughput struct {
		Rows                int     `json:"rows"`
		InsertSeconds       float64 `json:"insert_seconds"`
		Seconds             float64 `json:"seconds"`         // relay start until it stopped, every outcome recorded
		EffectsSeconds      float64 `json:"effects_seconds"` // relay start until the receiver's last effect
		DeliveriesPerSecond float64 `json:"deliveries_per_second"`
		RecordedSeconds     float64 `json:"recorded_seconds"` // the same as Seconds (kept for earlier reports' readers)
		Attempts            int64   `json:"attempts"`
		Claims              int     `json:"claims"`
		RowsPerClaim        float64 `json:"rows_per_claim"`
		RelayToRaw          float64 `json:"relay_to_raw"`
		// CPU per delivery from the relay's start until it stopped with every outcome
		// recorded: this process (relay, HTTP client and receiver), and the throwaway
		// PostgreSQL's processes (0: not measured, as with OUTBOX_DATABASE_URL).
		ProcessCPUMicros  float64 `json:"process_cpu_us_per_delivery,omitempty"`
		PostgresCPUMicros float64 `json:"postgres_cpu_us_per_delivery,omitempty"`
	} `json:"throughput"`
	Latency struct {
		OfferedRate  float64 `json:"offered_rate"`
		AchievedRate float64 `json:"achieved_rate"`
		Producers    int     `json:"producers"`
		Samples      int     `json:"samples"`
		P50Ms        float64 `json:"p50_ms"`
		P90Ms        float64 `json:"p90_ms"`
		P99Ms        float64 `json:"p99_ms"`
		MaxMs        float64 `json:"max_ms"`
		CommitP50Ms  float64 `json:"commit_p50_ms"`
		CommitP99Ms  float64 `json:"commit_p99_ms"`
		// CPU per row from the first producer's start until the last delivery, the
		// producers' transactions, the relay and the receiver together: this process,
		// and the throwaway PostgreSQL's processes; and what both used as a share of
		// the machine's CPUs (0: not measured, as with OUTBOX_DATABASE_URL).
		ProcessCPUMicros  float64 `json:"process_cpu_us_per_row,omitempty"`
		PostgresCPUMicros float64 `json:"postgres_cpu_us_per_row,omitempty"`
		CPUBusy           float64 `json:"cpu_busy,omitempty"`
		// The part of PostgresCPUMicros spent by the producers' own connections:
		// their INSERTs and durable COMMITs, which are the application's, not the relay's.
		ProducersPostgresCPUMicros float64 `json:"producers_postgres_cpu_us_per_row,omitempty"`
		// The relay's claim statements, empty polls included, and the rows they took.
		Claims       int     `json:"claims"`
		RowsPerClaim float64 `json:"rows_per_claim"`
		// The WAL flushes (fdatasync) the throwaway PostgreSQL made during the phase, as
		// its pg_stat_wal counted them, and their mean duration: every durable COMMIT,
		// the producers' and the relay's claims alike, waits for one (0: not measured,
		// as with OUTBOX_DATABASE_URL).
		WALFlushes int64   `json:"wal_flushes,omitempty"`
		WALFlushMs float64 `json:"wal_flush_ms,omitempty"`
	} `json:"latency"`
	Targets []benchTarget `json:"targets"`
}

// rawResult is what raw POSTs measured: phase 1, or one half of it.
type rawResult struct {
	Requests          int     `json:"requests"`
	Workers           int     `json:"workers"`
	Seconds           float64 `json:"seconds"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	// CPU this process used per request, client and receiver together (0: not measured).
	ProcessCPUMicros float64 `json:"process_cpu_us_per_request,omitempty"`
	// CPU the bench's own PostgreSQL used meanwhile, its background work (nil: not
	// measured); the phase itself asks nothing of it.
	PostgresCPUMs *float64 `json:"postgres_cpu_ms,omitempty"`

	elapsed time.Duration // Seconds, exactly
	cpu     cpuUse
}

// benchTarget is one of the targets and whether this run met it.
type benchTarget struct {
	Name string `json:"name"`
	Met  bool   `json:"met"`
}

// bench runs the benchmark; see newBenchCmd.
func bench(ctx context.Context, e *env, o benchOptions) (err error) {
	if err := o.validate(); err != nil {
		return err
	}
	logCfg, err := config.LoadLog(e.environ)
	if err != nil {
		return usageError{err}
	}
	// The report tells the story; the relay's logs only show problems.
	logger := newLogger(e.stderr, config.Log{Format: logCfg.Format, Level: "warn"})
	progress := func(format string, args ...any) { fmt.Fprintf(e.stderr, "bench: "+format+"\n", args...) }

	// Its throwaway cluster's directory is removed on the way out (see cleanStopSignals);
	// a reader of its output that went away fails the writes, not the process.
	ignoreBrokenPipes()
	ctx, stop := signal.NotifyContext(ctx, cleanStopSignals()...)
	defer stop()

	rep := &benchReport{}
	rep.Config.Rows, rep.Config.PayloadBytes, rep.Config.Concurrency = o.rows, o.payloadBytes, o.concurrency
	rep.Config.BatchSize, rep.Config.Rate, rep.Config.Duration = o.batchSize, o.rate, o.duration.String()
	rep.Machine.CPUs, rep.Machine.GOMAXPROCS = runtime.NumCPU(), runtime.GOMAXPROCS(0)
	rep.Machine.Platform, rep.Machine.Go = runtime.GOOS+"/"+runtime.GOARCH, runtime.Version()
	// The bench measures what serve does, so its process sets the collector as serve's
	// does for the default bound on claimed payloads.
	rep.Machine.GC = e.tuneGC(relay.DefaultMaxClaimedBytes)

	runID := randomHex(4)
	dbs, err := benchDatabases(ctx, e, o, runID, progress)
	if err != nil {
		return err
	}
	defer dbs.close(e.stderr)
	rep.Postgres.Source = dbs.source

	payload := benchPayload(o.payloadBytes)
	lat := &latencyRecorder{prefix: "bench-" + runID + "-lat-"}
	if dbs.cluster == nil {
		// On the user's database, a bench stopped before its rows finished (a signal, a
		// failure) cancels the rest: no relay has its instances, so they would wait there
		// for good, and every relay would warn about them. This runs after the phases
		// returned, and with them their relays.
		defer func() {
			if err != nil {
				cancelBenchRows(ctx, e.stderr, dbs.throughput, o.rows, runID, lat, progress)
			}
		}()
	}
	rcv, err := receiver.Start(receiver.Options{NoEffectLog: true, OnEffect: lat.onEffect})
	if err != nil {
		return fmt.Errorf("start receiver: %w", err)
	}
	defer rcv.Close()
	hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced})
	if err != nil {
		return fmt.Errorf("webhook connector: %w", err)
	}
	relayCfg := func() *relay.Config {
		return &relay.Config{
			Concurrency: o.concurrency, BatchSize: o.batchSize, Retention: benchRetention, Logger: logger,
			Registerer: prometheus.NewRegistry(),
		}
	}

	// Throughput database: settings, then phases 1 and 2.
	tput, err := openBenchPool(ctx, dbs.throughput, o.concurrency)
	if err != nil {
		return err
	}
	defer tput.Close()
	if err := tput.QueryRow(ctx, benchSettingsSQL).Scan(&rep.Postgres.Version, &rep.Postgres.Fsync,
		&rep.Postgres.SynchronousCommit, &rep.Postgres.FullPageWrites); err != nil {
		return fmt.Errorf("read server settings: %w", err)
	}
	progress("PostgreSQL %s, fsync=%s, synchronous_commit=%s, full_page_writes=%s", rep.Postgres.Version,
		rep.Postgres.Fsync, rep.Postgres.SynchronousCommit, rep.Postgres.FullPageWrites)
	if dbs.cluster != nil {
		// The throwaway cluster lives under TMPDIR, which may be in memory: its fsync
		// then costs nothing, and its commits are durable in name only.
		var dir string
		if err := tput.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dir); err != nil {
			return fmt.Errorf("read server settings: %w", err)
		}
		if fs := volatileStorage(dir); fs != "" {
			rep.Postgres.VolatileStorage = fs
			progress("warning: PostgreSQL's data directory %s is on %s, in memory: its fsync reaches no disk, so the figures "+
				"are not those of durable commits and meet no target; set TMPDIR to a directory on a disk", dir, fs)
		}
	}

	// Phases 1 and 2 run back to back, their rows inserted before either: compared as a
	// ratio, they must see the machine alike, and its speed drifts over seconds.
	if err := insertThroughputRows(ctx, o, rep, tput, dbs.tputInstance, dbs.cluster != nil, payload, runID, progress); err != nil {
		return fmt.Errorf("throughput phase: %w", err)
	}
	raw := func(half int) error {
		if err := benchRawPhase(ctx, o, rep, half, rcv.URL(), dbs.postgresPID(), payload, runID, progress); err != nil {
			return fmt.Errorf("raw phase: %w", err)
		}
		return nil
	}
	if err := raw(0); err != nil {
		return err
	}
	if err := benchThroughput(ctx, o, rep, tput, dbs.tputInstance, runID, dbs.postgresPID(), rcv, hook, relayCfg(), progress); err != nil {
		return fmt.Errorf("throughput phase: %w", err)
	}
	// Before the pool closes: its 128 backends exiting would take CPU from the POSTs.
	if err := raw(1); err != nil {
		return err
	}
	tput.Close()
	rep.Throughput.RelayToRaw = rep.Throughput.DeliveriesPerSecond / rep.Raw.RequestsPerSecond

	// Phase 3: latency, on a fresh database (or a fresh connector instance).
	if err := benchLatency(ctx, o, rep, dbs, lat, dbs.postgresPID(), hook, relayCfg(), payload, progress); err != nil {
		return fmt.Errorf("latency phase: %w", err)
	}

	rep.Targets = benchTargets(rep, o.rate)
	if o.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printBenchReport(e.stdout, rep)
	return nil
}

// benchTargets returns the targets and whether rep met them at the offered
// rate. The issue sets them for durable commits: figures measured on a server with
// fsync or synchronous_commit off (a database given with OUTBOX_DATABASE_URL may have
// either) or whose data directory is in memory meet none of them, whatever they are.
func benchTargets(rep *benchReport, rate float64) []benchTarget {
	// A latency measured at a lower rate than offered says nothing about the offered one.
	rateReached := rep.Latency.AchievedRate >= benchRateReached*rep.Latency.OfferedRate
	atRate := fmt.Sprintf(" at %g rows/s", rate)
	if !rateReached {
		atRate = fmt.Sprintf(" at %g rows/s (not reached: %.0f rows/s)", rate, rep.Latency.AchievedRate)
	}
	durable, why := true, ""
	switch pg := rep.Postgres; {
	case pg.Fsync != "on":
		durable, why = false, " (not counted: fsync="+pg.Fsync+")"
	case pg.SynchronousCommit == "off":
		durable, why = false, " (not counted: synchronous_commit=off)"
	case pg.VolatileStorage != "":
		durable, why = false, " (not counted: the data directory is on "+pg.VolatileStorage+")"
	}
	return []benchTarget{
		{fmt.Sprintf("at least %d deliveries/s%s", targetDeliveriesPerSec, why), durable && rep.Throughput.DeliveriesPerSecond >= targetDeliveriesPerSec},
		{fmt.Sprintf("relay at least %.1f × the raw rate%s", targetRelayToRaw, why), durable && rep.Throughput.RelayToRaw >= targetRelayToRaw},
		{fmt.Sprintf("commit-to-delivery p50 at most %s%s%s", targetP50, atRate, why), durable && rateReached && rep.Latency.P50Ms <= ms(targetP50)},
		{fmt.Sprintf("commit-to-delivery p99 at most %s%s%s", targetP99, atRate, why), durable && rateReached && rep.Latency.P99Ms <= ms(targetP99)},
	}
}

// benchDBs are the databases the phases use, and how to let go of them.
type benchDBs struct {
	source       string // for the report
	throughput   string // DSN of phases 1 and 2
	latency      string // DSN of phase 3
	tputInstance string // connector instance of phase 2's rows
	latInstance  string // connector instance of phase 3's rows
	cluster      *pgcluster.Cluster
}

// benchDatabases starts a durable throwaway cluster with one fresh database per phase,
// or uses OUTBOX_DATABASE_URL with a connector instance of its own per phase, so that
// neither phase sees the other's rows, nor the relays any other row.
func benchDatabases(ctx context.Context, e *env, o benchOptions, runID string, progress func(string, ...any)) (*benchDBs, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, benchSetupTimeout, errors.New("setting up the databases took too long"))
	defer cancel()
	db, given, err := config.LoadOptionalDatabase(e.environ)
	if err != nil {
		return nil, usageError{err}
	}
	if given {
		d := &benchDBs{
			source:       "OUTBOX_DATABASE_URL " + db.String(),
			throughput:   db.URL,
			latency:      db.URL,
			tputInstance: "webhook:bench_" + runID + "_throughput",
			latInstance:  "webhook:bench_" + runID + "_latency",
		}
		if err := migrateURL(ctx, db.URL); err != nil {
			return nil, usageError{fmt.Errorf("OUTBOX_DATABASE_URL: %w", err)}
		}
		return d, nil
	}

	binDir, err := pgcluster.FindBinDir()
	if err != nil {
		return nil, fmt.Errorf("%w; or set OUTBOX_DATABASE_URL to benchmark an existing database", err)
	}
	if e.ownsProcess {
		// The environment is the process's: only for a process of its own.
		pgcluster.ClearClientEnvironment()
	}
	progress("starting a throwaway PostgreSQL from %s with fsync=on, synchronous_commit=on", binDir)
	started := time.Now()
	// Room for the relays' pools (the throughput phase's opens every connection to warm
	// it), the latency phase's producers and this function's own, with pgcluster's 300
	// as the least.
	maxConns := max(300, 2*int(defaultMaxConns(o.concurrency))+max(o.producers, benchMaxProducers)+10)
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{
		// Durable commits, as production pays for them: the issue forbids weakening them.
		// The WAL flushes are timed, so that the latency phase can say what they cost.
		Fsync: true,
		ExtraSettings: map[string]string{"synchronous_commit": "on", "track_wal_io_timing": "on",
			"max_connections": strconv.Itoa(maxConns)},
	})
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	d := &benchDBs{
		source:       "throwaway cluster from " + binDir,
		throughput:   cluster.URL("outboxd_bench_throughput"),
		latency:      cluster.URL("outboxd_bench_latency"),
		tputInstance: "webhook",
		latInstance:  "webhook",
		cluster:      cluster,
	}
	if err := createDatabases(ctx, cluster.URL("postgres"), "outboxd_bench_throughput", "outboxd_bench_latency"); err != nil {
		d.close(e.stderr)
		return nil, err
	}
	for _, dsn := range []string{d.throughput, d.latency} {
		if err := migrateURL(ctx, dsn); err != nil {
			d.close(e.stderr)
			return nil, err
		}
	}
	progress("PostgreSQL ready on 127.0.0.1:%d after %s", cluster.Port(), time.Since(started).Round(10*time.Millisecond))
	return d, nil
}

// throughputKey is the key of phase 2's row j.
func throughputKey(runID string, j int) string { return fmt.Sprintf("bench-%s-t-%07d", runID, j) }

// cancelBenchRows cancels the rows of a bench stopped early that still wait for a relay,
// in the database at dsn: phase 2's rows and those phase 3 committed.
func cancelBenchRows(ctx context.Context, stderr io.Writer, dsn string, tputRows int, runID string, lat *latencyRecorder,
	progress func(string, ...any),
) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	keys := make([]string, 0, tputRows)
	for j := range tputRows {
		keys = append(keys, throughputKey(runID, j))
	}
	if n := lat.rows.Load(); n != nil {
		for i := range *n {
			keys = append(keys, lat.prefix+strconv.FormatInt(i, 10))
		}
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err == nil {
		defer pool.Close()
		var res ops.CancelResult
		if res, err = ops.Cancel(ctx, pool, keys, "outboxd bench", "the bench stopped before it finished", time.Time{}); err == nil {
			if len(res.Canceled) > 0 {
				progress("stopped before its rows finished; canceled the %d still waiting, so no relay waits for them", len(res.Canceled))
			}
			return
		}
	}
	fmt.Fprintln(stderr, "outboxd: cancel the bench's unfinished rows:", err)
}

// postgresPID is the throwaway cluster's postmaster, or 0 with OUTBOX_DATABASE_URL.
func (d *benchDBs) postgresPID() int {
	if d.cluster == nil {
		return 0
	}
	return d.cluster.PID()
}

func (d *benchDBs) close(stderr io.Writer) {
	if d.cluster == nil {
		return
	}
	if err := d.cluster.Stop(); err != nil {
		fmt.Fprintln(stderr, "outboxd: stop the throwaway PostgreSQL:", err)
	}
}

// createDatabases creates empty databases on the cluster at adminDSN.
func createDatabases(ctx context.Context, adminDSN string, names ...string) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, name := range names {
		// createDatabaseSQL: a fresh database per phase, so each starts from an empty table.
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return fmt.Errorf("create database %s: %w", name, err)
		}
	}
	return nil
}

// migrateURL applies the schema to the database at dsn.
func migrateURL(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := outboxd.Migrate(ctx, conn); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// openBenchPool opens a pool sized as `outboxd serve` sizes it for this concurrency.
func openBenchPool(ctx context.Context, dsn string, concurrency int) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(dsn, concurrency)
	if err != nil {
		return nil, usageError{fmt.Errorf("OUTBOX_DATABASE_URL: %w", err)}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database pool: %w", err)
	}
	return pool, nil
}

// awaitRelay checks done at every tick until it reports true, and fails when rr stops or
// ctx ends first, saying where it was (at()).
func awaitRelay(ctx context.Context, rr *runningRelay, tick <-chan time.Time, done func() (bool, error), at func() string) error {
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-rr.done:
			return fmt.Errorf("relay stopped %s: %v", at(), rr.err)
		case <-ctx.Done():
			return fmt.Errorf("%w %s", context.Cause(ctx), at())
		case <-tick:
		}
	}
}

// benchPayload returns a webhook body of exactly n bytes of JSON (n ≥ 64): an order
// event padded with a note.
// It is written as PostgreSQL's jsonb gives it back (keys shortest first, a space after
// each colon and comma), so that the relay, which sends the column's text, and the raw
// phase send the same n bytes.
func benchPayload(n int) json.RawMessage {
	const head = `{"note": "`
	const tail = `", "event": "order.paid", "amount": 4200, "currency": "eur", "customer": "cus_987", "order_id": "ord_12345"}`
	if pad := n - len(head) - len(tail); pad >= 0 {
		return json.RawMessage(head + strings.Repeat("x", pad) + tail)
	}
	const short = `", "event": "order.paid"}`
	return json.RawMessage(head + strings.Repeat("x", max(0, n-len(head)-len(short))) + short)
}

// benchRawPhase runs one half of phase 1, raw POSTs straight to the receiver, the
// relay's ceiling: half 0 before phase 2 (rows/2 POSTs), half 1 after it (the rest).
// After half 1, rep.Raw holds both together.
func benchRawPhase(ctx context.Context, o benchOptions, rep *benchReport, half int, url string, pgPID int, payload json.RawMessage, runID string,
	progress func(string, ...any),
) error {
	n := o.rows / 2
	when := "first half, before phase 2"
	if half == 1 {
		n = o.rows - n
		when = "second half, after phase 2"
	}
	if n > 0 && half == 0 {
		// Not timed: open the workers' keep-alive connections, as the relay phase finds
		// them open (it runs on the ones the raw POSTs left), so that the raw clock does
		// not count a handshake per worker that the relay's never does.
		wctx, cancel := context.WithTimeoutCause(ctx, benchPhaseTimeout, errors.New("opening the raw phase's connections took too long"))
		defer cancel()
		if _, err := benchRaw(wctx, url, payload, 4*o.concurrency, o.concurrency, fmt.Sprintf("bench-%s-raw0-", runID)); err != nil {
			return err
		}
	}
	if n > 0 {
		progress("phase 1: %d raw keep-alive POSTs to %s from %d workers (%s)", n, url, o.concurrency, when)
		ctx, cancel := context.WithTimeoutCause(ctx, benchPhaseTimeout, errors.New("the raw phase took too long"))
		defer cancel()
		cpu0 := cpuNow(pgPID)
		elapsed, err := benchRaw(ctx, url, payload, n, o.concurrency, fmt.Sprintf("bench-%s-raw%d-", runID, half+1))
		cpu := cpuNow(pgPID).since(cpu0)
		if err != nil {
			return err
		}
		rep.Raw.Halves = append(rep.Raw.Halves, newRawResult(n, o.concurrency, elapsed, cpu))
		progress("phase 1: %.0f req/s (%s)", rep.Raw.Halves[len(rep.Raw.Halves)-1].RequestsPerSecond, when)
	}
	if half == 1 {
		var (
			n       int
			elapsed time.Duration
			cpu     = cpuUse{selfOK: true, pgOK: true}
		)
		for _, h := range rep.Raw.Halves {
			n += h.Requests
			elapsed += h.elapsed
			cpu = cpuUse{self: cpu.self + h.cpu.self, pg: cpu.pg + h.cpu.pg,
				selfOK: cpu.selfOK && h.cpu.selfOK, pgOK: cpu.pgOK && h.cpu.pgOK}
		}
		rep.Raw.rawResult = newRawResult(n, o.concurrency, elapsed, cpu)
		progress("phase 1: %.0f req/s (both halves)", rep.Raw.RequestsPerSecond)
	}
	return nil
}

// newRawResult reports n raw POSTs from workers that took elapsed and cpu.
func newRawResult(n, workers int, elapsed time.Duration, cpu cpuUse) rawResult {
	r := rawResult{Requests: n, Workers: workers, Seconds: elapsed.Seconds(),
		RequestsPerSecond: float64(n) / elapsed.Seconds(), elapsed: elapsed, cpu: cpu}
	if cpu.selfOK {
		r.ProcessCPUMicros = micros(cpu.self) / float64(n)
	}
	if cpu.pgOK {
		pg := ms(cpu.pg)
		r.PostgresCPUMs = &pg
	}
	return r
}

// benchRaw POSTs payload n times to url from workers goroutines sharing the webhook
// connector's keep-alive transport, each request with its own Idempotency-Key, and
// returns the time it took. Like the connector, it hands requests straight to the
// transport, so the relay is compared with the same HTTP path at its cheapest.
func benchRaw(ctx context.Context, url string, payload []byte, n, workers int, keyPrefix string) (time.Duration, error) {
	transport := webhook.DefaultTransport()
	var (
		next     atomic.Int64
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	start := time.Now()
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) || ctx.Err() != nil {
					return
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
				if err != nil {
					fail(err)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", keyPrefix+strconv.FormatInt(i, 10))
				req.Header.Set("User-Agent", "outboxd")
				resp, err := transport.RoundTrip(req)
				if err != nil {
					fail(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					fail(fmt.Errorf("receiver answered %s", resp.Status))
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, firstErr
	}
	return elapsed, nil
}

// benchWarmSQL reads the outbox table and the indexes a claim and an outcome use.
var benchWarmSQL = []string{
	`SET LOCAL enable_seqscan = off`,
	`SELECT count(*) FROM outbox WHERE id > 0`,
	`SELECT count(*) FROM outbox WHERE idempotency_key > ''`,
	`SELECT count(*) FROM outbox WHERE status = 'pending'`,
	`SET LOCAL enable_seqscan = on`,
	`SET LOCAL enable_indexscan = off`,
	`SET LOCAL enable_indexonlyscan = off`,
	`SET LOCAL enable_bitmapscan = off`,
	`SELECT count(*) FROM outbox WHERE status <> ''`,
}

// warmPool has every connection the pool can open read the outbox table and its
// indexes, as the connections of a relay that has been running have. A PostgreSQL
// backend's first touch of each page of shared memory costs it more than the read
// itself (about 2 ms per MB on the reference machine, which has no huge pages), once
// per connection: without this, the relay's first rounds and its first refresh of the
// gauges would pay for the fresh connections of the bench's pool (together about 4 µs
// of PostgreSQL CPU per delivered row, 150 ms per connection), which a relay whose
// connections live for an hour does not. Only for the bench's own cluster, whose table
// holds nothing but the bench's rows: a database given with OUTBOX_DATABASE_URL may hold
// far more, which every connection would then read.
func warmPool(ctx context.Context, pool *pgxpool.Pool) error {
	conns := make([]*pgxpool.Conn, 0, pool.Config().MaxConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range cap(conns) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("warm the pool: %w", err)
		}
		conns = append(conns, c)
	}
	var g errgroup.Group
	for _, c := range conns {
		g.Go(func() error {
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			for _, q := range benchWarmSQL {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("warm the pool: %w", err)
	}
	return nil
}

// insertThroughputRows inserts phase 2's rows and, when warm is true (the bench's own
// cluster), has every connection of the pool read them; none of it is timed.
func insertThroughputRows(ctx context.Context, o benchOptions, rep *benchReport, pool *pgxpool.Pool, instance string, warm bool,
	payload json.RawMessage, runID string, progress func(string, ...any),
) error {
	ctx, cancel := context.WithTimeoutCause(ctx, benchPhaseTimeout, errors.New("inserting the throughput phase's rows took too long"))
	defer cancel()

	progress("setup: inserting %d rows of %d bytes for phase 2 (not timed)", o.rows, len(payload))
	insertStart := time.Now()
	msgs := make([]outbox.Message, 0, benchInsertBatch)
	for i := 0; i < o.rows; i += benchInsertBatch {
		msgs = msgs[:0]
		for j := i; j < min(i+benchInsertBatch, o.rows); j++ {
			msgs = append(msgs, outbox.Message{Key: throughputKey(runID, j), Connector: instance, Payload: payload})
		}
		if _, err := outbox.EnqueueBatch(ctx, pool, msgs); err != nil {
			return fmt.Errorf("insert rows: %w", err)
		}
	}
	rep.Throughput.InsertSeconds = time.Since(insertStart).Seconds()
	if warm {
		warmStart := time.Now()
		if err := warmPool(ctx, pool); err != nil {
			return err
		}
		progress("setup: every pool connection read the table and its indexes in %s (not timed)", time.Since(warmStart).Round(time.Millisecond))
	}
	return nil
}

// benchThroughput is phase 2: time a relay delivering the rows insertThroughputRows
// inserted.
func benchThroughput(ctx context.Context, o benchOptions, rep *benchReport, pool *pgxpool.Pool, instance, runID string, pgPID int,
	rcv *receiver.Receiver, hook connectors.Connector, cfg *relay.Config, progress func(string, ...any),
) error {
	ctx, cancel := context.WithTimeoutCause(ctx, benchPhaseTimeout, errors.New("the throughput phase took too long"))
	defer cancel()

	r, err := relay.New(pool, cfg, map[string]relay.Instance{instance: {Connector: hook}})
	if err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	progress("phase 2: relay delivering %d rows (concurrency %d, batch size %d)", o.rows, o.concurrency, o.batchSize)
	base := rcv.TotalEffects()
	cpu0 := cpuNow(pgPID)
	start := time.Now()
	rr := startRelay(ctx, r)
	defer func() { _ = rr.stop() }()
	poll := time.NewTicker(2 * time.Millisecond)
	defer poll.Stop()
	err = awaitRelay(ctx, rr, poll.C, func() (bool, error) { return rcv.TotalEffects()-base >= o.rows, nil },
		func() string { return fmt.Sprintf("after %d of %d deliveries", rcv.TotalEffects()-base, o.rows) })
	if err != nil {
		return err
	}
	effects := time.Since(start)
	// A delivery is done when its outcome is durable, not when the receiver acted: the
	// clock stops once the relay, stopped after the last effect, has written every
	// outcome it held (Run returns only then; the count by status below proves they
	// were). A stopping relay writes them at once, where a running one would within its
	// next round, some 10 ms. Looking in the table for rows still waiting instead cost
	// PostgreSQL 50–150 ms a look, over the partial indexes' entries of the phase's
	// finished rows, and was charged to the relay.
	if err := rr.stop(); err != nil {
		return err // it starts "relay: " already
	}
	elapsed := time.Since(start)
	recorded := elapsed
	cpu := cpuNow(pgPID).since(cpu0)
	if cpu.selfOK {
		rep.Throughput.ProcessCPUMicros = micros(cpu.self) / float64(o.rows)
	}
	if cpu.pgOK {
		rep.Throughput.PostgresCPUMicros = micros(cpu.pg) / float64(o.rows)
	}

	rep.Throughput.Rows = o.rows
	rep.Throughput.Seconds = elapsed.Seconds()
	rep.Throughput.EffectsSeconds = effects.Seconds()
	rep.Throughput.DeliveriesPerSecond = float64(o.rows) / elapsed.Seconds()
	rep.Throughput.RecordedSeconds = recorded.Seconds()
	rep.Throughput.Claims, rep.Throughput.RowsPerClaim = claimStats(cfg.Registerer)
	progress("phase 2: %.0f deliveries/s", rep.Throughput.DeliveriesPerSecond)

	// Every row delivered, each with exactly one effect.
	if extra := rcv.TotalEffects() - base - o.rows; extra != 0 {
		return fmt.Errorf("the receiver performed %d effects more than the %d rows", extra, o.rows)
	}
	if dups := rcv.DuplicateKeys(); len(dups) > 0 {
		return fmt.Errorf("the receiver performed %d keys' effects more than once, such as %s", len(dups), dups[0])
	}
	for j := range o.rows {
		if n := rcv.Effects(throughputKey(runID, j)); n != 1 {
			return fmt.Errorf("the receiver performed %d effects for the row %s, not one", n, throughputKey(runID, j))
		}
	}
	rows, err := pool.Query(ctx, benchStatusSQL, instance)
	if err != nil {
		return fmt.Errorf("count rows by status: %w", err)
	}
	var (
		delivered int64
		other     []string
	)
	for rows.Next() {
		var (
			status          string
			count, attempts int64
		)
		if err := rows.Scan(&status, &count, &attempts); err != nil {
			rows.Close()
			return fmt.Errorf("count rows by status: %w", err)
		}
		rep.Throughput.Attempts += attempts
		if status == outbox.StatusDelivered {
			delivered = count
		} else {
			other = append(other, fmt.Sprintf("%d %s", count, status))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("count rows by status: %w", err)
	}
	if delivered != int64(o.rows) || len(other) > 0 {
		return fmt.Errorf("after the relay stopped, %d of %d rows are delivered (others: %s)",
			delivered, o.rows, cmp.Or(strings.Join(other, ", "), "none"))
	}
	return nil
}

// latencyRecorder keeps, for each row of the latency phase, when its COMMIT returned and
// when its request reached the receiver, as offsets from base on the monotonic clock.
type latencyRecorder struct {
	prefix  string // keys are prefix + index
	base    time.Time
	commits []time.Duration       // written by the row's producer only
	arrived []atomic.Int64        // nanoseconds since base; 0 until the row arrives
	count   atomic.Int64          // rows arrived
	rows    atomic.Pointer[int64] // nil until the phase starts; then its row count
}

// start prepares for n rows.
func (l *latencyRecorder) start(n int) {
	l.base = time.Now()
	l.commits = make([]time.Duration, n)
	l.arrived = make([]atomic.Int64, n)
	rows := int64(n)
	l.rows.Store(&rows) // publishes the slices to onEffect
}

// onEffect is the receiver's hook: it notes the arrival of a latency row.
func (l *latencyRecorder) onEffect(eff receiver.Effect) {
	n := l.rows.Load()
	if n == nil {
		return
	}
	rest, ok := strings.CutPrefix(eff.Key, l.prefix)
	if !ok {
		return
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || int64(i) >= *n {
		return
	}
	if l.arrived[i].CompareAndSwap(0, max(1, int64(eff.At.Sub(l.base)))) {
		l.count.Add(1)
	}
}

// benchLatency is phase 3: a fresh relay, and single-row transactions at a steady rate.
func benchLatency(ctx context.Context, o benchOptions, rep *benchReport, dbs *benchDBs, lat *latencyRecorder, pgPID int,
	hook connectors.Connector, cfg *relay.Config, payload json.RawMessage, progress func(string, ...any),
) error {
	ctx, cancel := context.WithTimeoutCause(ctx, benchPhaseTimeout+o.duration, errors.New("the latency phase took too long"))
	defer cancel()

	n := max(1, int(math.Round(o.rate*o.duration.Seconds())))
	producers := o.producers
	if producers == 0 {
		producers = min(benchMaxProducers, max(4, int(math.Ceil(o.rate/benchRowsPerProducer))))
	}
	producers = min(producers, n)
	rep.Latency.OfferedRate, rep.Latency.Producers = o.rate, producers

	pool, err := openBenchPool(ctx, dbs.latency, o.concurrency)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The application's connections are not the relay's.
	appCfg, err := pgxpool.ParseConfig(dbs.latency)
	if err != nil {
		return usageError{fmt.Errorf("OUTBOX_DATABASE_URL: %w", err)}
	}
	appCfg.MaxConns, appCfg.MinConns = int32(producers), int32(producers)
	app, err := pgxpool.NewWithConfig(ctx, appCfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer app.Close()
	if err := app.Ping(ctx); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	// The producers' backends, to tell their CPU from the relay's; only in the bench's
	// own cluster, whose processes run on this machine.
	var producerPIDs []int
	if pgPID > 0 {
		if producerPIDs, err = backendPIDs(ctx, app, producers); err != nil {
			return fmt.Errorf("connect: %w", err)
		}
	}

	r, err := relay.New(pool, cfg, map[string]relay.Instance{dbs.latInstance: {Connector: hook}})
	if err != nil {
		return err
	}
	rr := startRelay(ctx, r)
	defer func() { _ = rr.stop() }()
	if err := rr.waitReady(ctx); err != nil {
		return err
	}

	progress("phase 3: %g rows/s offered for %s (%d single-row transactions from %d producers)", o.rate, o.duration, n, producers)
	lat.start(n)
	interval := time.Duration(float64(time.Second) / o.rate)
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		errOnce  sync.Once
	)
	pctx, stopProducers := context.WithCancel(ctx)
	defer stopProducers()
	var wal0 walFlushes
	if pgPID > 0 {
		if wal0, err = readWALFlushes(ctx, pool); err != nil {
			return err
		}
	}
	cpu0 := cpuNow(pgPID, producerPIDs...)
	start := time.Now()
	for range producers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || pctx.Err() != nil {
					return
				}
				// Open loop: row i is due at start + i/rate, whether or not earlier rows
				// have been delivered. The wait ends with the phase: at a low --rate, rows
				// are minutes apart, and an interrupt must not wait for the next one.
				if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
					due := time.NewTimer(wait)
					select {
					case <-pctx.Done():
						due.Stop()
						return
					case <-due.C:
					}
				}
				key := lat.prefix + strconv.Itoa(i)
				err := pgx.BeginFunc(pctx, app, func(tx pgx.Tx) error {
					_, err := outbox.Enqueue(pctx, tx, outbox.Message{Key: key, Connector: dbs.latInstance, Payload: payload})
					return err
				})
				lat.commits[i] = time.Since(lat.base)
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("enqueue %s: %w", key, err); stopProducers() })
					return
				}
			}
		})
	}
	wg.Wait()
	offered := time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	// Over the n slots of 1/rate the rows fill: the last row is due at the start of the
	// last slot, so the time until its COMMIT alone would spread n rows over n-1 slots.
	rep.Latency.AchievedRate = float64(n) / (offered + interval).Seconds()

	// The last rows are still on their way.
	drain, cancelDrain := context.WithTimeoutCause(ctx, benchLatencyDrain,
		fmt.Errorf("rows were still undelivered %s after the load ended", benchLatencyDrain))
	defer cancelDrain()
	poll := time.NewTicker(2 * time.Millisecond)
	defer poll.Stop()
	for lat.count.Load() < int64(n) {
		select {
		case <-rr.done:
			return fmt.Errorf("relay stopped after %d of %d deliveries: %v", lat.count.Load(), n, rr.err)
		case <-drain.Done():
			return fmt.Errorf("%w: %d of %d delivered", context.Cause(drain), lat.count.Load(), n)
		case <-poll.C:
		}
	}
	loaded := time.Since(start)
	cpu := cpuNow(pgPID, producerPIDs...).since(cpu0)
	if cpu.selfOK {
		rep.Latency.ProcessCPUMicros = micros(cpu.self) / float64(n)
		if cpu.pgOK {
			rep.Latency.PostgresCPUMicros = micros(cpu.pg) / float64(n)
			rep.Latency.ProducersPostgresCPUMicros = micros(cpu.backends) / float64(n)
			rep.Latency.CPUBusy = float64(cpu.self+cpu.pg) / (float64(loaded) * float64(runtime.NumCPU()))
		}
	}
	if err := rr.stop(); err != nil {
		return err // it starts "relay: " already
	}
	rep.Latency.Claims, rep.Latency.RowsPerClaim = claimStats(cfg.Registerer)
	if pgPID > 0 {
		// Read once the relay has stopped, later than the CPU: backends report their
		// counts at most once a second, so the phase's last moments may still be missing
		// from both the count and the time, and the stop's last writes add a few
		// flushes; the mean stays fair.
		wal, err := readWALFlushes(ctx, pool)
		if err != nil {
			return err
		}
		if n := wal.count - wal0.count; n > 0 {
			rep.Latency.WALFlushes = n
			rep.Latency.WALFlushMs = (wal.ms - wal0.ms) / float64(n)
		}
	}

	latencies := make([]time.Duration, n)
	commitGaps := make([]time.Duration, n)
	for i := range n {
		// A request can reach the receiver before the producer's COMMIT call returns
		// (the relay is woken by the commit itself); that counts as no latency at all.
		latencies[i] = max(0, time.Duration(lat.arrived[i].Load())-lat.commits[i])
		scheduled := time.Duration(i) * interval
		commitGaps[i] = lat.commits[i] - start.Sub(lat.base) - scheduled
	}
	slices.Sort(latencies)
	slices.Sort(commitGaps)
	rep.Latency.Samples = n
	rep.Latency.P50Ms = ms(percentile(latencies, 0.50))
	rep.Latency.P90Ms = ms(percentile(latencies, 0.90))
	rep.Latency.P99Ms = ms(percentile(latencies, 0.99))
	rep.Latency.MaxMs = ms(latencies[n-1])
	rep.Latency.CommitP50Ms = ms(percentile(commitGaps, 0.50))
	rep.Latency.CommitP99Ms = ms(percentile(commitGaps, 0.99))
	progress("phase 3: p50 %.2f ms, p99 %.2f ms", rep.Latency.P50Ms, rep.Latency.P99Ms)
	return nil
}

// walFlushes is what pg_stat_wal counts of the WAL's flushes: how many, and the
// milliseconds they took (when track_wal_io_timing is on).
type walFlushes struct {
	count int64
	ms    float64
}

func readWALFlushes(ctx context.Context, pool *pgxpool.Pool) (walFlushes, error) {
	var (
		w       walFlushes
		version int
	)
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return w, fmt.Errorf("read server_version_num: %w", err)
	}
	if err := pool.QueryRow(ctx, walFlushesSQL(version)).Scan(&w.count, &w.ms); err != nil {
		return w, fmt.Errorf("read the WAL flushes: %w", err)
	}
	return w, nil
}

// walFlushesSQL reads the WAL's flushes and their milliseconds on a server of version
// (server_version_num): pg_stat_wal has them until PostgreSQL 17, and pg_stat_io, as
// the fsyncs of the object wal, from 18, which dropped pg_stat_wal's columns.
func walFlushesSQL(version int) string {
	if version >= 180000 {
		return `SELECT coalesce(sum(fsyncs), 0)::bigint, coalesce(sum(fsync_time), 0)::float8 FROM pg_stat_io WHERE object = 'wal'`
	}
	return `SELECT wal_sync, wal_sync_time FROM pg_stat_wal`
}

// cpuUse is CPU time used by this process and by the throwaway PostgreSQL's processes
// (the postmaster pgPID and its children), each with whether it could be measured, and
// by the backends among them that the samples named (the latency phase's producers').
type cpuUse struct {
	self, pg, backends time.Duration
	selfOK, pgOK       bool
}

// cpuSample is what cpuNow read: this process's CPU so far, before and after the
// reading of the others', PostgreSQL's per process, and the named backends' together.
type cpuSample struct {
	self, selfAfter time.Duration
	pg              proccpu.Sample
	backends        time.Duration
	selfOK, pgOK    bool
}

// cpuNow returns the CPU used so far (none measured for PostgreSQL when pgPID is 0,
// as with OUTBOX_DATABASE_URL), the backends' included.
//
// Reading PostgreSQL's processes reads every process's /proc stat file, once more for
// each backend: milliseconds of this process's CPU each time (6.6 ms on the reference
// machine), spent before the phase starts or after it ended. So this process's CPU is
// read on both sides of that reading, and a phase counts from the one after it, in its
// first sample, to the one before it, in its last.
func cpuNow(pgPID int, backends ...int) cpuSample {
	var u cpuSample
	u.self, u.selfOK = proccpu.Self()
	u.pg, u.pgOK = proccpu.Tree(pgPID)
	u.backends = backendsCPU(backends)
	after, ok := proccpu.Self()
	u.selfAfter, u.selfOK = after, u.selfOK && ok
	return u
}

// since returns the CPU used between start and u; of PostgreSQL's, by the server's
// processes, those that exited meanwhile included (a backend, an autovacuum worker: see
// proccpu.Sample.Since).
func (u cpuSample) since(start cpuSample) cpuUse {
	return cpuUse{self: u.self - start.selfAfter, pg: u.pg.Since(start.pg), backends: u.backends - start.backends,
		selfOK: u.selfOK && start.selfOK, pgOK: u.pgOK && start.pgOK}
}

// backendPIDs holds all n connections of pool at once and returns the process ids of
// their PostgreSQL backends.
func backendPIDs(ctx context.Context, pool *pgxpool.Pool, n int) ([]int, error) {
	pids := make([]int, 0, n)
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer c.Release()
		var pid int
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// backendsCPU returns the CPU time the backends pids have used so far (0 where it
// cannot be read).
func backendsCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		if s, ok := proccpu.Tree(pid); ok {
			sum += s.Total()
		}
	}
	return sum
}

// claimStats reads from the relay's metrics how many claim statements it ran and how
// many rows they took on average.
func claimStats(reg prometheus.Registerer) (claims int, rowsPerClaim float64) {
	g, ok := reg.(prometheus.Gatherer)
	if !ok {
		return 0, 0
	}
	families, err := g.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range families {
		if mf.GetName() != "outboxd_claim_batch_rows" || len(mf.GetMetric()) == 0 {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() > 0 {
			return int(h.GetSampleCount()), h.GetSampleSum() / float64(h.GetSampleCount())
		}
	}
	return 0, 0
}

// percentile returns the nearest-rank percentile p (0 < p ≤ 1) of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// printBenchReport writes rep for a person.
func printBenchReport(w io.Writer, rep *benchReport) {
	c, pg := rep.Config, rep.Postgres
	fmt.Fprintf(w, "outboxd bench\n")
	fmt.Fprintf(w, "  config:     rows=%d payload=%dB concurrency=%d batch=%d rate=%g rows/s duration=%s\n",
		c.Rows, c.PayloadBytes, c.Concurrency, c.BatchSize, c.Rate, c.Duration)
	fmt.Fprintf(w, "  postgres:   %s, fsync=%s, synchronous_commit=%s, full_page_writes=%s (%s)\n",
		pg.Version, pg.Fsync, pg.SynchronousCommit, pg.FullPageWrites, pg.Source)
	if pg.VolatileStorage != "" {
		fmt.Fprintf(w, "              its data directory is on %s, in memory: fsync reaches no disk\n", pg.VolatileStorage)
	}
	fmt.Fprintf(w, "  machine:    %d CPUs, GOMAXPROCS=%d, %s, %s, %s\n\n", rep.Machine.CPUs, rep.Machine.GOMAXPROCS, rep.Machine.Platform, rep.Machine.Go, rep.Machine.GC)

	fmt.Fprintf(w, "raw keep-alive POSTs:   %8.0f req/s         (%d requests, %d workers, %.2fs",
		rep.Raw.RequestsPerSecond, rep.Raw.Requests, rep.Raw.Workers, rep.Raw.Seconds)
	if h := rep.Raw.Halves; len(h) == 2 {
		fmt.Fprintf(w, ":\n                                                %d right before the relay at %.0f req/s, %d right after at %.0f req/s",
			h[0].Requests, h[0].RequestsPerSecond, h[1].Requests, h[1].RequestsPerSecond)
	}
	fmt.Fprintln(w, ")")
	t := rep.Throughput
	fmt.Fprintf(w, "relay throughput:       %8.0f deliveries/s  (%d pre-inserted rows in %.2fs from relay start until it stopped, every outcome recorded;\n"+
		"                                                last effect at %.2fs; %d attempts; %d claims, %.1f rows per claim)\n",
		t.DeliveriesPerSecond, t.Rows, t.Seconds, t.EffectsSeconds, t.Attempts, t.Claims, t.RowsPerClaim)
	fmt.Fprintf(w, "relay / raw:            %8.2f\n", t.RelayToRaw)
	if rep.Raw.ProcessCPUMicros > 0 && t.ProcessCPUMicros > 0 {
		fmt.Fprintf(w, "CPU per request:        %8.0f µs in this process for a raw POST (client and receiver)", rep.Raw.ProcessCPUMicros)
		if pg := rep.Raw.PostgresCPUMs; pg != nil {
			fmt.Fprintf(w, ";\n                                                PostgreSQL's background work meanwhile: %.0f ms", *pg)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "CPU per delivery:       %8.0f µs in this process (relay, client and receiver)", t.ProcessCPUMicros)
		if t.PostgresCPUMicros > 0 {
			fmt.Fprintf(w, " + %.0f µs in PostgreSQL", t.PostgresCPUMicros)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)

	l := rep.Latency
	fmt.Fprintf(w, "commit-to-delivery latency at %g rows/s offered (achieved %.1f rows/s, %d producers, single-row transactions):\n",
		l.OfferedRate, l.AchievedRate, l.Producers)
	fmt.Fprintf(w, "  p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms   (%d samples)\n",
		l.P50Ms, l.P90Ms, l.P99Ms, l.MaxMs, l.Samples)
	fmt.Fprintf(w, "  each transaction, from its scheduled start to COMMIT returning: p50 %.2f ms, p99 %.2f ms\n", l.CommitP50Ms, l.CommitP99Ms)
	fmt.Fprintf(w, "  the relay: %d claims (empty polls included), %.1f rows per claim\n", l.Claims, l.RowsPerClaim)
	if l.ProcessCPUMicros > 0 {
		fmt.Fprintf(w, "  CPU per row, producers, relay and receiver together: %.0f µs in this process", l.ProcessCPUMicros)
		if l.CPUBusy > 0 {
			fmt.Fprintf(w, " + %.0f µs in PostgreSQL, of which %.0f µs\n  in the producers' connections (their INSERTs and durable COMMITs); the %d CPUs were %.0f%% busy with them",
				l.PostgresCPUMicros, l.ProducersPostgresCPUMicros, rep.Machine.CPUs, 100*l.CPUBusy)
		}
		fmt.Fprintln(w)
	}
	if l.WALFlushes > 0 {
		fmt.Fprintf(w, "  PostgreSQL flushed its WAL %d times, %.2f ms per flush on average (pg_stat_wal); every durable COMMIT waits for one\n",
			l.WALFlushes, l.WALFlushMs)
	}
	if l.AchievedRate < benchRateReached*l.OfferedRate {
		fmt.Fprintf(w, "  the producers fell behind: single-row transactions could not commit at %g rows/s on this machine\n", l.OfferedRate)
	}
	fmt.Fprintln(w)

	fmt.Fprintf(w, "issue targets (for the default flags on a 2-core machine):\n")
	for _, tg := range rep.Targets {
		mark := "met   "
		if !tg.Met {
			mark = "MISSED"
		}
		fmt.Fprintf(w, "  %s  %s\n", mark, tg.Name)
	}
}
