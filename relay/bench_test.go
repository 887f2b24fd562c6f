package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/proccpu"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// BenchmarkClaimAndRecord measures PostgreSQL's share of delivering a row: b.N pending
// rows of about 500 bytes are claimed 500 at a time and recorded as delivered, each
// round's outcomes written in the transaction of the next claim, as the relay does. It
// reports the CPU the server's backend spent per row (pg-µs/row) and per row inserted
// in batches of 1,000 beforehand (insert-pg-µs/row), read from /proc, so they hold on a
// busy machine where wall time does not. Against a server on another machine only
// ns/op is reported. No receiver is involved.
//
//	go test ./relay -run '^$' -bench ClaimAndRecord -benchtime 50000x -count 3
//
// "schema" is the table as schema.sql makes it; "fillfactor=70" is schema version 2's
// setting, kept for comparison.
func BenchmarkClaimAndRecord(b *testing.B) {
	for _, v := range []struct{ name, alter string }{
		{"schema", ""},
		{"fillfactor=70", "ALTER TABLE outbox SET (fillfactor = 70)"},
	} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(pgtest.URL(b))
			if err != nil {
				b.Fatal(err)
			}
			cfg.MinConns, cfg.MaxConns = 1, 1 // one backend does all the work measured
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			var pid int
			if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				b.Fatal(err)
			}
			if v.alter != "" {
				if _, err := pool.Exec(ctx, v.alter); err != nil {
					b.Fatal(err)
				}
			}
			insertCPU := benchInsert(ctx, b, pool, pid, b.N)

			// The connector is never called: the rows are recorded as its answer below.
			hook := newHook(b, "http://127.0.0.1:1/never")
			r, err := New(pool, &Config{ID: "bench-relay"}, map[string]Instance{"webhook": {Connector: hook}})
			if err != nil {
				b.Fatal(err)
			}
			inst := r.instances["webhook"]
			plan := []claimPlan{{inst: inst, limit: 500, bytes: 1 << 30}}
			answer := json.RawMessage(`{"status":200,"body":"ok"}`)

			b.ResetTimer()
			cpu0, measured := proccpu.Tree(pid)
			var outs []outcome
			delivered := 0
			for {
				got, err := r.claimAndRecord(ctx, plan, outs)
				if err != nil {
					b.Fatal(err)
				}
				if len(got[0]) == 0 && len(outs) == 0 {
					break
				}
				now := r.now()
				outs = outs[:0]
				for _, row := range got[0] {
					o := r.decide(inst, row, answer, nil, now)
					o.started = row.claimedAt
					outs = append(outs, o)
				}
				delivered += len(got[0])
			}
			b.StopTimer()
			cpu1, _ := proccpu.Tree(pid)
			if delivered != b.N {
				b.Fatalf("delivered %d rows of %d", delivered, b.N)
			}
			var left int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status <> 'delivered'`).Scan(&left); err != nil {
				b.Fatal(err)
			}
			if left != 0 {
				b.Fatalf("%d rows not delivered", left)
			}
			if measured && insertCPU >= 0 {
				b.ReportMetric(float64(cpu1.Since(cpu0))/float64(time.Microsecond)/float64(b.N), "pg-µs/row")
				b.ReportMetric(float64(insertCPU)/float64(time.Microsecond)/float64(b.N), "insert-pg-µs/row")
			}
		})
	}
}

// benchInsert inserts n pending webhook rows in batches of 1,000 and returns the CPU
// backend pid spent on it, or -1 when it cannot be read.
func benchInsert(ctx context.Context, b *testing.B, pool *pgxpool.Pool, pid, n int) time.Duration {
	b.Helper()
	payload := json.RawMessage(`{"event":"order.paid","order_id":"ord_12345","customer":"cus_987","amount":4200,"currency":"eur","note":"` +
		strings.Repeat("x", 396) + `"}`)
	cpu0, ok := proccpu.Tree(pid)
	msgs := make([]outbox.Message, 0, 1000)
	for i := 0; i < n; i += len(msgs) {
		msgs = msgs[:0]
		for j := i; j < min(i+1000, n); j++ {
			msgs = append(msgs, outbox.Message{Key: fmt.Sprintf("bench-%07d", j), Connector: "webhook", Payload: payload})
		}
		if _, err := outbox.EnqueueBatch(ctx, pool, msgs); err != nil {
			b.Fatal(err)
		}
	}
	cpu1, _ := proccpu.Tree(pid)
	if !ok {
		return -1
	}
	return cpu1.Since(cpu0)
}

// BenchmarkOneKeyBacklog measures how fast a running relay works off a backlog of b.N
// rows of one ordering key, which go out one at a time, to a loopback receiver that
// enforces keys: ns/op is the time per row from the relay's start until every row is
// delivered. A backlog of twice as many rows should take twice as long, not four times
// (compare -benchtime 1000x with 2000x).
//
//	go test ./relay -run '^$' -bench OneKeyBacklog -benchtime 2000x
func BenchmarkOneKeyBacklog(b *testing.B) { benchOrderedBacklog(b, 1) }

// BenchmarkManyKeysBacklog is BenchmarkOneKeyBacklog with the rows spread over 2,000
// ordering keys (10 rows each at -benchtime 20000x), as with a key per customer or
// order: what parking behind rows in flight costs where few rows wait behind each.
//
//	go test ./relay -run '^$' -bench ManyKeysBacklog -benchtime 20000x
func BenchmarkManyKeysBacklog(b *testing.B) { benchOrderedBacklog(b, 2000) }

// benchOrderedBacklog runs a relay over b.N rows spread over keys ordering keys, row i
// on key i % keys, until every row is delivered.
func benchOrderedBacklog(b *testing.B, keys int) {
	ctx := context.Background()
	rcv, err := receiver.Start(receiver.Options{NoEffectLog: true})
	if err != nil {
		b.Fatal(err)
	}
	defer rcv.Close()
	pool := pgtest.DB(b)
	msgs := make([]outbox.Message, b.N)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: fmt.Sprint("row-", i), Connector: "webhook", OrderingKey: fmt.Sprint("k-", i%keys), Payload: map[string]int{"i": i}}
	}
	for batch := range slices.Chunk(msgs, 1000) {
		if _, err := outbox.EnqueueBatch(ctx, pool, batch); err != nil {
			b.Fatal(err)
		}
	}
	r, err := New(pool, &Config{Logger: testLogger(), Registerer: prometheus.NewRegistry()},
		map[string]Instance{"webhook": {Connector: newHook(b, rcv.URL())}})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	go func() { done <- r.Run(runCtx) }()
	for left := b.N; left > 0; {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status <> 'delivered'`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if got := rcv.TotalEffects(); got != b.N {
		b.Fatalf("%d effects for %d rows", got, b.N)
	}
}
