package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgcluster"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/proccpu"
	"github.com/outboxd/outboxd/internal/receiver"
)

// TestBenchSmoke runs a tiny `outboxd bench`: it must finish and report its figures.
// It asserts nothing about them: tests never assert on timings.
func TestBenchSmoke(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("bench needs the PostgreSQL server binaries (apt-get install postgresql): %v", err)
	}
	small := []string{"bench", "--rows", "500", "--duration", "1s", "--rate", "200", "--concurrency", "16", "--batch-size", "100"}

	t.Run("Text", func(t *testing.T) {
		t.Parallel()
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), small, nil, strings.NewReader(""), &stdout, &stderr)
		require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
		out := stdout.String()
		require.Contains(t, out, "req/s")
		require.Contains(t, out, "deliveries/s")
		require.Contains(t, out, "p50 ")
		require.Contains(t, out, "p99 ")
		require.Contains(t, out, "(200 samples)")
		require.Contains(t, out, "fsync=on, synchronous_commit=on")
		require.Contains(t, out, "rows=500 payload=500B concurrency=16 batch=100")
		if runtime.GOOS == "linux" {
			require.Regexp(t, `CPU per row, producers, relay and receiver together: \d+ µs in this process \+ \d+ µs in PostgreSQL, of which \d+ µs\n  in the producers' connections \(their INSERTs and durable COMMITs\); the \d+ CPUs were \d+% busy`, out)
			require.Regexp(t, `PostgreSQL flushed its WAL \d+ times, \d+\.\d\d ms per flush on average \(pg_stat_wal\)`, out)
		}
		// The raw POSTs run after the rows are inserted, half right before the relay and
		// half right after it.
		progress := stderr.String()
		at := func(line string) int {
			i := strings.Index(progress, line)
			require.GreaterOrEqual(t, i, 0, "no %q in the progress:\n%s", line, progress)
			return i
		}
		require.Less(t, at("bench: setup: inserting"), at("bench: phase 1:"))
		require.Less(t, at("bench: phase 1:"), at("(first half, before phase 2)"))
		require.Less(t, at("(first half, before phase 2)"), at("bench: phase 2:"))
		require.Less(t, at("bench: phase 2:"), at("(second half, after phase 2)"))
		require.Less(t, at("(second half, after phase 2)"), at("(both halves)"))
		require.Less(t, at("(both halves)"), at("bench: phase 3:"))
		require.Regexp(t, `raw keep-alive POSTs: +\d+ req/s +\(500 requests, 16 workers, \d+\.\d\ds:\n +250 right before the relay at \d+ req/s, 250 right after at \d+ req/s\)`, out)
	})

	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		rep, _ := benchJSON(t, nil, small[1:]...)
		require.Equal(t, 500, rep.Throughput.Rows)
		require.Equal(t, int64(500), rep.Throughput.Attempts, "no row needed a retry")
		require.Positive(t, rep.Throughput.DeliveriesPerSecond)
		require.Positive(t, rep.Raw.RequestsPerSecond)
		// The raw rate is both halves' requests over both halves' time.
		require.Len(t, rep.Raw.Halves, 2)
		require.Equal(t, 500, rep.Raw.Requests)
		require.Equal(t, 500, rep.Raw.Halves[0].Requests+rep.Raw.Halves[1].Requests)
		require.InDelta(t, rep.Raw.Halves[0].Seconds+rep.Raw.Halves[1].Seconds, rep.Raw.Seconds, 1e-9)
		require.InDelta(t, 500/rep.Raw.Seconds, rep.Raw.RequestsPerSecond, 1e-6)
		require.InDelta(t, rep.Throughput.DeliveriesPerSecond/rep.Raw.RequestsPerSecond, rep.Throughput.RelayToRaw, 1e-9)
		require.Equal(t, 200, rep.Latency.Samples)
		require.LessOrEqual(t, rep.Latency.P50Ms, rep.Latency.P99Ms)
		require.Positive(t, rep.Latency.Claims)
		require.Positive(t, rep.Latency.RowsPerClaim)
		require.Equal(t, "on", rep.Postgres.Fsync)
		require.Equal(t, "on", rep.Postgres.SynchronousCommit)
		require.Len(t, rep.Targets, 4)
		if runtime.GOOS == "linux" {
			require.Positive(t, rep.Raw.ProcessCPUMicros)
			require.NotNil(t, rep.Raw.PostgresCPUMs, "the bench's own cluster: its CPU during the raw phase is measured")
			for _, h := range rep.Raw.Halves {
				require.Positive(t, h.ProcessCPUMicros)
				require.NotNil(t, h.PostgresCPUMs)
				require.GreaterOrEqual(t, *h.PostgresCPUMs, 0.0, "a process that exits takes nothing away")
			}
			require.Positive(t, rep.Throughput.ProcessCPUMicros)
			require.GreaterOrEqual(t, rep.Throughput.PostgresCPUMicros, 0.0)
			require.Positive(t, rep.Latency.ProcessCPUMicros)
			require.Positive(t, rep.Latency.CPUBusy, "the bench's own cluster: PostgreSQL's CPU is measured")
			require.Positive(t, rep.Latency.ProducersPostgresCPUMicros)
			require.Less(t, rep.Latency.ProducersPostgresCPUMicros, rep.Latency.PostgresCPUMicros)
		}
		// 200 durable single-row transactions and the relay's claims: PostgreSQL flushed
		// its WAL for them, and timed the flushes.
		require.Positive(t, rep.Latency.WALFlushes)
		require.Positive(t, rep.Latency.WALFlushMs)
	})
}

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"NoRows", []string{"bench", "--rows", "0"}, "--rows must be at least 1, got 0"},
		{"NegativeRate", []string{"bench", "--rate", "-5"}, "--rate must be a positive number of rows/s, got -5"},
		{"ZeroDuration", []string{"bench", "--duration", "0s"}, "--duration must be positive, got 0s"},
		// benchPhaseTimeout + --duration bounds the latency phase: it must not overflow,
		// which would fail the phase at once, after the throughput phase ran.
		{"HugeDuration", []string{"bench", "--rows", "10", "--concurrency", "2", "--rate", "0.000001", "--duration", "2562047h47m"},
			"--duration must be at most 24h0m0s, got 2562047h47m0s"},
		// Fewer than one row offered: the phase would send one anyway and report its rate.
		{"NoLatencyRows", []string{"bench", "--rows", "10", "--concurrency", "2", "--rate", "0.1", "--duration", "1s"},
			"--rate × --duration must give at least 1 row, got 0.1"},
		{"TinyPayload", []string{"bench", "--payload-bytes", "10"}, "--payload-bytes must be between 64 and 1048576, got 10"},
		{"BadFlag", []string{"bench", "--rows", "many"}, `invalid argument "many" for "--rows"`},
		{"Arguments", []string{"bench", "now"}, `outboxd bench takes no arguments, got "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, nil, strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, exitUsage, code, stderr.String())
			require.Contains(t, stderr.String(), tt.want)
			require.Contains(t, stderr.String(), "Run 'outboxd bench --help' for usage.")
			require.Empty(t, stdout.String())
		})
	}
}

func TestBenchPayload(t *testing.T) {
	t.Parallel()
	for _, n := range []int{64, 100, 500, 4096} {
		p := benchPayload(n)
		require.Len(t, p, n)
		require.True(t, json.Valid(p), string(p))
	}
}

func TestBenchHelp(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"bench", "--help"}, nil, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "Examples:\n")
	require.Contains(t, stdout.String(), "  outboxd bench\n")
	require.NotContains(t, stdout.String(), "cpuprofile", "the profiling flag is hidden")
}

// TestBenchPayloadAsSent: the relay sends the payload column's text, as PostgreSQL's
// jsonb gives it back; the raw phase must POST those same bytes, of the size asked.
func TestBenchPayloadAsSent(t *testing.T) {
	pool := pgtest.DB(t)
	for _, n := range []int{64, 100, 500, 4096} {
		p := benchPayload(n)
		var asSent string
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT $1::text::jsonb::text`, string(p)).Scan(&asSent))
		require.Equal(t, string(p), asSent, "the relay would send %d bytes where the raw phase sends %d", len(asSent), len(p))
		require.Len(t, asSent, n)
	}
}

// TestBenchRawFirstHalfOnOpenConnections: the relay phase runs on the keep-alive
// connections the raw phase opened, so the timed raw POSTs must not open them either:
// a handshake per worker inside the raw clock lowers the raw rate and flatters the ratio.
func TestBenchRawFirstHalfOnOpenConnections(t *testing.T) {
	t.Parallel()
	rcv, err := receiver.Start(receiver.Options{NoEffectLog: true})
	require.NoError(t, err)
	defer rcv.Close()
	var before atomic.Int64
	before.Store(-1)
	progress := func(format string, args ...any) {
		// benchRawPhase announces the timed POSTs right before starting the clock.
		if strings.Contains(fmt.Sprintf(format, args...), "raw keep-alive POSTs") {
			before.Store(rcv.Connections())
		}
	}
	o := benchOptions{rows: 4000, concurrency: 32}
	rep := &benchReport{}
	require.NoError(t, benchRawPhase(t.Context(), o, rep, 0, rcv.URL(), 0, benchPayload(500), "t", progress))
	require.GreaterOrEqual(t, before.Load(), int64(0), "the timed POSTs were announced")
	timed := rcv.Connections() - before.Load()
	require.LessOrEqual(t, timed, int64(o.concurrency/4),
		"the timed raw POSTs opened %d of the %d connections (%d in all)", timed, o.concurrency, rcv.Connections())
}

// TestBenchInterruptedWhileProducersWait: an interrupt must stop the latency phase at
// once, even while its producers wait for their rows' scheduled times, which at a low
// --rate are far apart: here row 0 is due at once and row 1 in 2,000 s.
func TestBenchInterruptedWhileProducersWait(t *testing.T) {
	t.Parallel()
	dsn := pgtest.URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"bench", "--rows", "10", "--concurrency", "2", "--rate", "0.0005", "--duration", "1h"},
			[]string{"OUTBOX_DATABASE_URL=" + dsn}, strings.NewReader(""), &stdout, &stderr)
	}()
	// Row 0 committed: its producer is done, and the other waits for row 1.
	deadline := time.After(processWait)
	for tick := time.Tick(20 * time.Millisecond); ; {
		var committed bool
		require.NoError(t, pool.QueryRow(t.Context(),
			`SELECT EXISTS (SELECT 1 FROM outbox WHERE idempotency_key LIKE 'bench-%-lat-0')`).Scan(&committed))
		if committed {
			break
		}
		select {
		case code := <-done:
			t.Fatalf("bench exited with %d before its latency phase's first row; stderr:\n%s", code, stderr.String())
		case <-deadline:
			t.Fatalf("no latency row within %s; stderr:\n%s", processWait, stderr.String())
		case <-tick:
		}
	}
	cancel()
	select {
	case code := <-done:
		require.Equal(t, exitFailure, code, "stderr:\n%s", stderr.String())
	case <-time.After(processWait):
		t.Fatalf("bench did not stop within %s of its interrupt; stderr:\n%s", processWait, stderr.String())
	}
}

// TestBenchInterruptedLeavesNoPendingRows: a bench stopped on a user's database must not
// leave pending rows under its own connector instances, which no relay will ever have:
// every relay on that database would warn about them, and status count them, for good.
func TestBenchInterruptedLeavesNoPendingRows(t *testing.T) {
	t.Parallel()
	dsn := pgtest.URL(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Phase 2's rows are inserted, and its relay has not started.
	stderr := &cancelOnWriter{marker: "bench: phase 2:", cancel: cancel}
	var stdout bytes.Buffer
	code := run(ctx, []string{"bench", "--rows", "200", "--concurrency", "2", "--rate", "10", "--duration", "1s"},
		[]string{"OUTBOX_DATABASE_URL=" + dsn}, strings.NewReader(""), &stdout, stderr)
	require.Equal(t, exitFailure, code, "stderr:\n%s", stderr.String())

	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var rows, unfinished int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*),
		count(*) FILTER (WHERE status NOT IN ('delivered', 'dead', 'canceled')) FROM outbox`).Scan(&rows, &unfinished))
	require.Equal(t, 200, rows, "phase 2's rows were inserted")
	require.Zero(t, unfinished, "rows left waiting for a connector instance that no relay has\nstderr:\n%s", stderr.String())
}

// TestBenchAchievedRateNeverAboveOffered: the producers never commit a row before it is
// due, so the achieved rate cannot exceed the offered one. Row i is due at i/rate: the
// last of n rows at (n-1)/rate, and the n rows fill n slots of 1/rate.
func TestBenchAchievedRateNeverAboveOffered(t *testing.T) {
	t.Parallel()
	rep, _ := benchJSON(t, []string{"OUTBOX_DATABASE_URL=" + pgtest.URL(t)},
		"--rows", "10", "--concurrency", "2", "--rate", "4", "--duration", "1s")
	require.Equal(t, 4, rep.Latency.Samples)
	require.LessOrEqual(t, rep.Latency.AchievedRate, rep.Latency.OfferedRate)
}

// TestBenchHighConcurrency: the bench's own cluster must take the connections its pools
// open for --concurrency, which above about 4,700 are more than its 300 default
// max_connections (every one of the throughput pool's is opened to warm it).
func TestBenchHighConcurrency(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("bench needs the PostgreSQL server binaries (apt-get install postgresql): %v", err)
	}
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"bench", "--rows", "10", "--concurrency", "4800", "--rate", "10", "--duration", "1s"},
		nil, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, "stderr:\n%s", stderr.String())
}

// TestBenchTargetsNeedDurableCommits: the targets are for durable commits, so a
// run on a database without them (the test cluster runs with fsync=off) meets none of
// them, and says why, however fast it was.
func TestBenchTargetsNeedDurableCommits(t *testing.T) {
	t.Parallel()
	rep, _ := benchJSON(t, []string{"OUTBOX_DATABASE_URL=" + pgtest.URL(t)},
		"--rows", "10", "--concurrency", "2", "--rate", "20", "--duration", "1s")
	require.Equal(t, "off", rep.Postgres.Fsync)
	require.Len(t, rep.Targets, 4)
	for _, tg := range rep.Targets {
		require.False(t, tg.Met, "%s: met with fsync=off", tg.Name)
		require.Contains(t, tg.Name, "(not counted: fsync=off)")
	}
}

// TestBenchWALFlushesByVersion: PostgreSQL 18 dropped pg_stat_wal's wal_sync and
// wal_sync_time, which the latency phase read on the bench's own cluster, so the bench
// failed there after phases 1 and 2; from 18 the flushes are pg_stat_io's fsyncs of the
// object wal. The older form still reads the server the tests run on.
func TestBenchWALFlushesByVersion(t *testing.T) {
	t.Parallel()
	require.Contains(t, walFlushesSQL(180000), "FROM pg_stat_io WHERE object = 'wal'")
	require.NotContains(t, walFlushesSQL(180000), "wal_sync")
	require.Contains(t, walFlushesSQL(170005), "FROM pg_stat_wal")

	pool, err := pgxpool.New(t.Context(), pgtest.URL(t))
	require.NoError(t, err)
	defer pool.Close()
	_, err = readWALFlushes(t.Context(), pool)
	require.NoError(t, err)
}

// benchJSON runs bench with args and --json in environ, requires it to succeed, and
// returns its report and what it wrote to stderr.
func benchJSON(t *testing.T, environ []string, args ...string) (benchReport, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), append(append([]string{"bench"}, args...), "--json"), environ, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	var rep benchReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), stdout.String())
	return rep, stderr.String()
}

// TestBenchCPUSampleLeavesOutItsOwnCost: reading PostgreSQL's CPU reads every
// process's /proc stat file, which costs this process milliseconds of CPU (6.6 ms a
// reading on the reference machine). A phase's CPU in this process must not include
// the cost of the reading that starts it: the latency phase's nine readings (the
// server's and each producer's backend) added about 60 µs a row to a 1-second run,
// 6 µs to the default 10 seconds.
// Not parallel: the process's CPU is the test's measure.
func TestBenchCPUSampleLeavesOutItsOwnCost(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("CPU is measured on Linux only")
	}
	pid := os.Getpid() // a process tree that exists, as the postmaster's does
	const readings = 3
	before, ok := proccpu.Self()
	require.True(t, ok)
	for range readings {
		_, found := proccpu.Tree(pid)
		require.True(t, found)
	}
	after, _ := proccpu.Self()
	oneReading := (after - before) / readings

	// PostgreSQL's processes alone, and with eight producers' backends, as the latency
	// phase reads them.
	producers := []int{pid, pid, pid, pid, pid, pid, pid, pid}
	for _, backends := range [][]int{nil, producers} {
		start := cpuNow(pid, backends...)
		got := cpuNow(pid, backends...).since(start)
		require.True(t, got.selfOK)
		// Half a reading: the counted reading alone would be about one; the margin is for
		// the process's other threads (a GC cycle the readings' allocations start) on a
		// busy machine.
		require.Less(t, got.self, oneReading/2,
			"two readings back to back (%d backends): the phase between them used %s of this process's CPU (a reading costs %s)",
			len(backends), got.self, oneReading)
	}
}
