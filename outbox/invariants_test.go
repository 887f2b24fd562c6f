package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Messages PostgreSQL refuses (text with NUL or invalid UTF-8, numbers numeric cannot hold,
// timestamps outside timestamptz) must fail with ErrInvalidMessage before the INSERT,
// which would otherwise abort the caller's transaction.
func TestInvalidValuesKeepTxUsable(t *testing.T) {
	t.Parallel()
	for name, m := range map[string]outbox.Message{
		"created_by NUL":       {Key: "k", Connector: "webhook", Payload: []int{1}, CreatedBy: "a\x00b"},
		"created_by not UTF-8": {Key: "k", Connector: "webhook", Payload: []int{1}, CreatedBy: "a\xffb"},
		"number too big":       {Key: "k", Connector: "webhook", Payload: json.RawMessage(`{"a":1e131072}`)},
		"number too small":     {Key: "k", Connector: "webhook", Payload: json.RawMessage(`{"a":1e-16384}`)},
		"number exponent huge": {Key: "k", Connector: "webhook", Payload: json.RawMessage(`[1e99999999999999999999]`)},
		"not_before too late":  {Key: "k", Connector: "webhook", Payload: []int{1}, NotBefore: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"not_before too early": {Key: "k", Connector: "webhook", Payload: []int{1}, NotBefore: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			tx := pgtest.Tx(t)
			_, err := outbox.Enqueue(ctx, tx, m)
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.Equal(t, 0, countRows(t, tx), "the transaction is still usable")

			_, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{webhookMsg("fine", []int{1}), m})
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.Equal(t, 0, countRows(t, tx), "the transaction is still usable")
		})
	}
	// The limits themselves are fine.
	for name, m := range map[string]outbox.Message{
		"largest number":    {Key: "k", Connector: "webhook", Payload: json.RawMessage(`{"a":9e131071}`)},
		"smallest fraction": {Key: "k", Connector: "webhook", Payload: json.RawMessage(`{"a":1e-16383, "b":0.5e-16382}`)},
		"year 1 and 294275": {Key: "k", Connector: "webhook", Payload: []int{1}, NotBefore: time.Date(294275, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		t.Run("ok "+name, func(t *testing.T) {
			t.Parallel()
			in, err := outbox.Enqueue(t.Context(), pgtest.Tx(t), m)
			require.NoError(t, err)
			require.True(t, in.Inserted)
		})
	}
}

// Numbers are compared by value, exactly: not through float64 (which makes different
// amounts "the same request"), and not by spelling (which makes the same amount a
// conflict). A row written by plain SQL and one written by Enqueue compare alike.
func TestNumbersComparedExactly(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		a, b string
		same bool
	}{
		{`{"a":12345678901234567891.0}`, `{"a":12345678901234567890.0}`, false},
		{`{"amount":0.1}`, `{"amount":0.1000000000000000000001}`, false},
		{`{"a":1e20}`, `{"a":100000000000000000000}`, true},
		{`{"a":12345678901234567890}`, `{"a":12345678901234567890.0}`, true},
		{`{"a":1}`, `{"a":1.0}`, true},
		{`{"a":[1e400]}`, `{"a":[10e399]}`, true},
		{`{"a":[-0.0]}`, `{"a":[0]}`, true},
	} {
		for _, plainSQL := range []bool{false, true} {
			ctx := t.Context()
			tx := pgtest.Tx(t)
			if plainSQL {
				_, err := tx.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('n', 'webhook', $1)`, tt.a)
				require.NoError(t, err)
			} else {
				_, err := outbox.Enqueue(ctx, tx, webhookMsg("n", json.RawMessage(tt.a)))
				require.NoError(t, err)
			}
			in, err := outbox.Enqueue(ctx, tx, webhookMsg("n", json.RawMessage(tt.b)))
			if tt.same {
				require.NoError(t, err, "%s vs %s (plain SQL %v)", tt.a, tt.b, plainSQL)
				require.False(t, in.Inserted)
			} else {
				require.ErrorIs(t, err, outbox.ErrKeyConflict, "%s vs %s (plain SQL %v)", tt.a, tt.b, plainSQL)
			}

			// The same within one batch.
			_, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{
				webhookMsg("m", json.RawMessage(tt.a)), webhookMsg("m", json.RawMessage(tt.b)),
			})
			if tt.same {
				require.NoError(t, err, "batch %s vs %s", tt.a, tt.b)
			} else {
				require.ErrorIs(t, err, outbox.ErrKeyConflict, "batch %s vs %s", tt.a, tt.b)
			}
			require.NoError(t, tx.Rollback(ctx))
		}
	}
}

// vanishingTx deletes, from another connection, the row holding a key right after the
// batch's insert skipped it and before the batch looks it up (retention's DELETE).
type vanishingTx struct {
	pgx.Tx
	pool    *pgxpool.Pool
	key     string
	queries int
}

func (v *vanishingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	v.queries++
	if v.queries == 2 {
		if _, err := v.pool.Exec(ctx, `DELETE FROM outbox WHERE idempotency_key = $1`, v.key); err != nil {
			return nil, err
		}
	}
	return v.Tx.Query(ctx, sql, args...)
}

// A batch error must leave nothing of the batch in the caller's transaction.
func TestBatchRowVanishesLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	_, err := outbox.Enqueue(ctx, pool, webhookMsg("old", []int{1}))
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
	vt := &vanishingTx{Tx: tx, pool: pool, key: "old"}
	out, err := outbox.EnqueueBatch(ctx, vt, []outbox.Message{webhookMsg("new", []int{2}), webhookMsg("old", []int{1})})
	if err == nil {
		// Retrying is also fine, if it yields both rows.
		require.Len(t, out, 2)
		require.Equal(t, 2, countRows(t, tx))
		return
	}
	require.Equal(t, 0, countRows(t, tx), "the batch failed (%v) but left its other rows in the transaction", err)
}

// REPEATABLE READ / SERIALIZABLE: a caller whose snapshot predates another transaction's
// commit of the same key cannot see that row, so it cannot return it: PostgreSQL raises
// a serialization failure (40001), which such callers retry. It is never a unique
// violation, and never a wrong Inserted. The same through a DB of the caller's that
// wraps the transaction: the package cannot tell it is one, and must not retry the
// statement in the aborted transaction, which turned the 40001 into 25P02 (current
// transaction is aborted), which such callers do not retry.
func TestRepeatableReadSameKey(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		for _, wrapped := range []bool{false, true} {
			ctx := t.Context()
			pool := pgtest.DB(t)
			mine, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			defer mine.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup, before the pool closes

			require.Equal(t, 0, countRows(t, mine)) // takes the snapshot

			_, err = outbox.Enqueue(ctx, pool, webhookMsg("rr", []int{1}))
			require.NoError(t, err)

			var db outbox.DB = mine
			if wrapped {
				db = wrapDB{mine}
			}
			_, err = outbox.Enqueue(ctx, db, webhookMsg("rr", []int{1}))
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "40001", pgErr.Code, "%s (wrapped %v): %v", iso, wrapped, err)
			require.NoError(t, mine.Rollback(ctx))
		}
	}
}

// wrapDB is a DB of a caller's own, such as one that traces its statements: only the
// methods DB asks for.
type wrapDB struct{ db outbox.DB }

func (w wrapDB) Begin(ctx context.Context) (pgx.Tx, error) { return w.db.Begin(ctx) }
func (w wrapDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return w.db.Exec(ctx, sql, args...)
}
func (w wrapDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return w.db.Query(ctx, sql, args...)
}
func (w wrapDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return w.db.QueryRow(ctx, sql, args...)
}

// waitBlocked waits until the backend pid is blocked on a lock.
func waitBlocked(t *testing.T, pool *pgxpool.Pool, pid int) {
	t.Helper()
	for {
		var blocked bool
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT cardinality(pg_blocking_pids($1)) > 0`, pid).Scan(&blocked))
		if blocked {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal("never blocked")
		default:
		}
	}
}

// READ COMMITTED: two transactions enqueue one key at once; the second waits for the
// first and then gets the documented result, with its transaction usable.
func TestConcurrentSameKeyReadCommitted(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		payload   []int
		commit    bool
		inserted  bool
		wantError error
	}{
		{"same request, first commits", []int{1}, true, false, nil},
		{"different request, first commits", []int{2}, true, false, outbox.ErrKeyConflict},
		{"same request, first rolls back", []int{1}, false, true, nil},
		{"different request, first rolls back", []int{2}, false, true, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.DB(t)
			first, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer first.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
			_, err = outbox.Enqueue(ctx, first, webhookMsg("c", []int{1}))
			require.NoError(t, err)

			second, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer second.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
			var pid int
			require.NoError(t, second.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
			type res struct {
				in  outbox.Intent
				err error
			}
			done := make(chan res, 1)
			go func() {
				in, err := outbox.Enqueue(ctx, second, webhookMsg("c", tt.payload))
				done <- res{in, err}
			}()
			waitBlocked(t, pool, pid)
			if tt.commit {
				require.NoError(t, first.Commit(ctx))
			} else {
				require.NoError(t, first.Rollback(ctx))
			}
			r := <-done
			if tt.wantError != nil {
				require.ErrorIs(t, r.err, tt.wantError)
			} else {
				require.NoError(t, r.err)
				require.Equal(t, tt.inserted, r.in.Inserted)
			}
			require.Equal(t, 1, countRows(t, second), "the transaction is usable")
		})
	}
}

// Two batches holding the same keys in opposite orders must not deadlock (40P01 would
// abort one caller's transaction): the batch takes its keys' locks in key order.
// A third transaction holding "z" lines them up: a's batch [x, z, y] holds x and waits
// on z; b's batch [y, x] then holds y (given order) and waits on x; when z is released,
// a goes on to y and, in the given order, the two deadlock.
func TestBatchesOppositeOrders(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)
	begin := func() (pgx.Tx, int) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { tx.Rollback(context.WithoutCancel(ctx)) }) //nolint:errcheck // cleanup
		var pid int
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		return tx, pid
	}
	c, _ := begin()
	a, pidA := begin()
	b, pidB := begin()
	_, err := outbox.Enqueue(ctx, c, webhookMsg("z", []int{1}))
	require.NoError(t, err)

	doneA, doneB := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := outbox.EnqueueBatch(ctx, a, []outbox.Message{webhookMsg("x", []int{1}), webhookMsg("z", []int{1}), webhookMsg("y", []int{1})})
		doneA <- err
	}()
	waitBlocked(t, pool, pidA)
	go func() {
		_, err := outbox.EnqueueBatch(ctx, b, []outbox.Message{webhookMsg("y", []int{1}), webhookMsg("x", []int{1})})
		doneB <- err
	}()
	waitBlocked(t, pool, pidB)
	require.NoError(t, c.Rollback(ctx))

	require.NoError(t, <-doneA, "a must not be the deadlock's victim")
	require.NoError(t, a.Commit(ctx))
	require.NoError(t, <-doneB, "b must not be the deadlock's victim")
	require.Equal(t, 3, countRows(t, b))
}

// After `outboxd purge --payload-only` ("keep keys and results") the row's payload is {}
// but its fingerprint is kept: an application repeating the same request must still get
// the existing intent, not ErrKeyConflict.
func TestSameRequestAfterPayloadPurge(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)
	m := webhookMsg("purged", map[string]any{"email": "a@example.com"})
	_, err := outbox.Enqueue(ctx, tx, m)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE outbox SET status = 'delivered', payload = '{}'::jsonb WHERE idempotency_key = 'purged'`)
	require.NoError(t, err)
	in, err := outbox.Enqueue(ctx, tx, m)
	require.NoError(t, err)
	require.False(t, in.Inserted)
	_, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{m})
	require.NoError(t, err)
	// A different request for that key is still a conflict.
	_, err = outbox.Enqueue(ctx, tx, webhookMsg("purged", map[string]any{"email": "b@example.com"}))
	require.ErrorIs(t, err, outbox.ErrKeyConflict)
}

// A zero with an exponent PostgreSQL refuses (>= INT_MAX/2) must be ErrInvalidMessage,
// not an aborted transaction.
func TestZeroWithHugeExponent(t *testing.T) {
	t.Parallel()
	for _, p := range []string{`[0e1073741823]`, `[0.0e2000000000]`, `[-0e1099511627776]`} {
		ctx := t.Context()
		tx := pgtest.Tx(t)
		_, err := outbox.Enqueue(ctx, tx, webhookMsg("z", json.RawMessage(p)))
		require.ErrorIs(t, err, outbox.ErrInvalidMessage, p)
		require.Equal(t, 0, countRows(t, tx), "the transaction is still usable")
	}
	// The largest exponent PostgreSQL takes.
	in, err := outbox.Enqueue(t.Context(), pgtest.Tx(t), webhookMsg("z", json.RawMessage(`[0e1073741822, 0e-1]`)))
	require.NoError(t, err)
	require.True(t, in.Inserted)
}

// Ids are drawn in batch order although rows are inserted in key order.
func TestBatchIdsInBatchOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)
	keys := []string{"z", "m", "a", "q", "b", "y", "c"}
	var msgs []outbox.Message
	for _, k := range keys {
		msgs = append(msgs, outbox.Message{Key: k, Connector: "webhook", Payload: []int{1}, OrderingKey: "o"})
	}
	out, err := outbox.EnqueueBatch(ctx, tx, msgs)
	require.NoError(t, err)
	for i := 1; i < len(out); i++ {
		require.Less(t, out[i-1].ID, out[i].ID, "ids in batch order: %v", out)
	}
}

// A payload past jsonb's limits fails with ErrInvalidMessage before the INSERT, which
// PostgreSQL would fail ("invalid memory alloc request size 1073741824", SQLSTATE XX000),
// aborting the caller's transaction: 32 MiB of zeros in one array, 2^24+1 of them, is
// enough, and so is an object of 2^23+1 members of one name (jsonb gathers them all before
// it drops duplicates; decoding in Go keeps one), or a header of 256 MiB.
// TestJsonbCountsNamesWhatJsonbCannotHold
// and TestStorableNamesWhatJsonbCannotHold check each limit.
func TestPayloadPastJsonbLimitsKeepsTxUsable(t *testing.T) {
	t.Parallel()
	zeros := append([]byte("["), bytes.Repeat([]byte("0,"), 1<<24+1)...)
	zeros[len(zeros)-1] = ']'
	same := append([]byte("{"), bytes.Repeat([]byte(`"a":0,`), 1<<23+1)...)
	same[len(same)-1] = '}'
	t.Run("headers", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		tx := pgtest.Tx(t)
		m := webhookMsg("big", []int{1})
		m.Headers = map[string]string{"x-big": strings.Repeat("v", 1<<28)} // "string too long to represent as jsonb string"
		_, err := outbox.Enqueue(ctx, tx, m)
		require.ErrorIs(t, err, outbox.ErrInvalidMessage)
		in, err := outbox.Enqueue(ctx, tx, webhookMsg("fine", []int{1}))
		require.NoError(t, err, "the transaction is still usable")
		require.True(t, in.Inserted)
	})
	for name, payload := range map[string][]byte{"zeros": zeros, "one name": same} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			tx := pgtest.Tx(t)
			_, err := outbox.Enqueue(ctx, tx, webhookMsg("big", json.RawMessage(payload)))
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			in, err := outbox.Enqueue(ctx, tx, webhookMsg("fine", []int{1}))
			require.NoError(t, err, "the transaction is still usable")
			require.True(t, in.Inserted)
		})
	}
}
