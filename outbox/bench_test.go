package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// benchPayload is a ~500-byte webhook body, a typical event.
var benchPayload = json.RawMessage(`{"event":"order.paid","order_id":"ord_12345","customer":{"id":"cus_987","email":"ada@example.com","name":"Ada Lovelace"},"amount":4200,"currency":"eur","items":[{"sku":"book-1","qty":1,"price":2100},{"sku":"book-2","qty":1,"price":2100}],"note":"` + strings.Repeat("x", 220) + `"}`)

// BenchmarkEnqueue compares Enqueue with a bare INSERT of the same row, each in its own
// transaction (BEGIN, statement, COMMIT), and EnqueueBatch with batches of 100. Compare
// the rows/s metrics of one run:
//
//	go test ./outbox -run '^$' -bench Enqueue -benchtime 3000x
//
// Each sub-benchmark gets a fresh database, so none pays for the rows (and the
// autovacuum work) of the one before.
func BenchmarkEnqueue(b *testing.B) {
	ctx := context.Background()
	var seq int
	next := func() string { seq++; return fmt.Sprintf("bench-%d", seq) }

	b.Run("bare_insert", func(b *testing.B) {
		pool := pgtest.DB(b)
		b.ReportAllocs()
		for b.Loop() {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ($1, $2, $3)`,
					next(), "webhook", []byte(benchPayload))
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})

	b.Run("enqueue", func(b *testing.B) {
		pool := pgtest.DB(b)
		b.ReportAllocs()
		for b.Loop() {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, outbox.Message{Key: next(), Connector: "webhook", Payload: benchPayload})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})

	for _, size := range []int{10, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			pool := pgtest.DB(b)
			b.ReportAllocs()
			msgs := make([]outbox.Message, size)
			for b.Loop() {
				for i := range msgs {
					msgs[i] = outbox.Message{Key: next(), Connector: "webhook", Payload: benchPayload}
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.EnqueueBatch(ctx, tx, msgs)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
