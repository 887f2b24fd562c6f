package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func webhookMsg(key string, payload any) outbox.Message {
	return outbox.Message{Key: key, Connector: "webhook", Payload: payload}
}

func countRows(t *testing.T, db outbox.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n))
	return n
}

func TestEnqueueVisibleOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	in, err := outbox.Enqueue(ctx, tx, webhookMsg("order-1/notify", map[string]any{"order": 1}))
	require.NoError(t, err)
	require.True(t, in.Inserted)
	require.Equal(t, outbox.StatusPending, in.Status)

	// Another connection (the relay's view) does not see it before commit.
	_, err = outbox.Get(ctx, pool, "order-1/notify")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.NoError(t, tx.Commit(ctx))

	got, err := outbox.Get(ctx, pool, "order-1/notify")
	require.NoError(t, err)
	require.Equal(t, in.ID, got.ID)
	require.JSONEq(t, `{"order": 1}`, string(got.Payload))

	// A rollback leaves nothing.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx, webhookMsg("order-2/notify", map[string]any{"order": 2}))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = outbox.Get(ctx, pool, "order-2/notify")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.Equal(t, 1, countRows(t, pool))
}

func TestEnqueueSameRequestIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)

	first, err := outbox.Enqueue(ctx, tx, outbox.Message{
		Key: "k1", Connector: "webhook:crm", OrderingKey: "customer-7",
		Payload: json.RawMessage(`{"a": 1, "b": {"c": [1, 2.50, "x"]}}`),
	})
	require.NoError(t, err)
	require.True(t, first.Inserted)

	// Same request, written differently: key order, whitespace, number spelling.
	again, err := outbox.Enqueue(ctx, tx, outbox.Message{
		Key: "k1", Connector: "webhook:crm", OrderingKey: "customer-7",
		Payload: json.RawMessage("{\"b\":{\"c\":[1.0,2.5,\"x\"]},\n \"a\":1e0}"),
	})
	require.NoError(t, err)
	require.False(t, again.Inserted)
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, 1, countRows(t, tx))
}

func TestEnqueueConflict(t *testing.T) {
	t.Parallel()

	for name, other := range map[string]outbox.Message{
		"payload":      {Key: "k", Connector: "webhook", Payload: map[string]any{"amount": 11}},
		"connector":    {Key: "k", Connector: "webhook:crm", Payload: map[string]any{"amount": 10}},
		"ordering key": {Key: "k", Connector: "webhook", Payload: map[string]any{"amount": 10}, OrderingKey: "o"},
	} {
		for _, purged := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/purged=%v", name, purged), func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				tx := pgtest.Tx(t)
				_, err := outbox.Enqueue(ctx, tx, outbox.Message{Key: "k", Connector: "webhook", Payload: map[string]any{"amount": 10}})
				require.NoError(t, err)
				if purged {
					// As `outboxd purge --payload-only` leaves it: only the fingerprint,
					// which covers the connector and ordering key too, tells the payload.
					_, err = tx.Exec(ctx, `UPDATE outbox SET payload = '{}' WHERE idempotency_key = 'k'`)
					require.NoError(t, err)
				}

				_, err = outbox.Enqueue(ctx, tx, other)
				require.ErrorIs(t, err, outbox.ErrKeyConflict)
				require.Contains(t, err.Error(), `"k"`)
				// The message names what differs, and only that.
				require.Contains(t, err.Error(), "whose "+name+" differs")
				for _, same := range []string{"connector", "payload", "ordering key"} {
					if same != name {
						require.NotContains(t, err.Error(), same, "%s is the same", same)
					}
				}

				// The caller's transaction is still usable.
				require.Equal(t, 1, countRows(t, tx))
			})
		}
	}
}

func TestEnqueueConflictWithPlainSQLRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)
	_, err := tx.Exec(ctx, `INSERT INTO outbox (idempotency_key, connector, payload) VALUES ('sql-1', 'webhook', '{"x": 1, "y": [true]}')`)
	require.NoError(t, err)

	in, err := outbox.Enqueue(ctx, tx, webhookMsg("sql-1", json.RawMessage(`{"y":[true],"x":1}`)))
	require.NoError(t, err)
	require.False(t, in.Inserted)

	_, err = outbox.Enqueue(ctx, tx, webhookMsg("sql-1", json.RawMessage(`{"y":[false],"x":1}`)))
	require.ErrorIs(t, err, outbox.ErrKeyConflict)
}

func TestEnqueueConcurrentSameKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)

	const n = 100
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		inserted int
		ids      = map[int64]bool{}
		errs     []error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			record := func(in outbox.Intent) {
				mu.Lock()
				defer mu.Unlock()
				ids[in.ID] = true
				if in.Inserted {
					inserted++
				}
			}
			var err error
			if i%2 == 0 {
				// Half the callers enqueue on the pool directly (autocommit) ...
				var in outbox.Intent
				if in, err = outbox.Enqueue(ctx, pool, webhookMsg("same-key", map[string]any{"v": "same"})); err == nil {
					record(in)
				}
			} else {
				// ... and half inside their own transaction.
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					in, err := outbox.Enqueue(ctx, tx, webhookMsg("same-key", map[string]any{"v": "same"}))
					if err == nil {
						record(in)
					}
					return err
				})
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()

	require.Empty(t, errs)
	require.Equal(t, 1, inserted)
	require.Len(t, ids, 1)
	require.Equal(t, 1, countRows(t, pool))
}

func TestEnqueueValidation(t *testing.T) {
	t.Parallel()

	ok := func(connector string, payload string) outbox.Message {
		return outbox.Message{Key: "k-" + connector, Connector: connector, Payload: json.RawMessage(payload)}
	}
	valid := []outbox.Message{
		ok("webhook", `{"a":1}`),
		ok("webhook", `[1,2]`),
		ok("webhook:crm", `{}`),
		ok("email", `{"to":"a@example.com","subject":"Hi","text":"Hello"}`),
		ok("email", `{"to":["A <a@example.com>","b@example.com"],"cc":"c@example.com","subject":"Hi","html":"<p>Hello</p>","headers":{"X-Tag":"t"}}`),
		ok("email:support", `{"to":["a@example.com"],"subject":"Hi","text":"x","reply_to":"r@example.com"}`),
		ok("slack", `{"channel":"C123","text":"hi"}`),
		ok("slack", `{"channel":"C123","blocks":[{"type":"section"}],"thread_ts":"1700000000.000100"}`),
		ok("payment", `{"operation":"payment_intent.create","params":{"amount":100,"currency":"usd"}}`),
		ok("payment:eu", `{"operation":"refund.create","params":{"payment_intent":"pi_1"}}`),
		{Key: strings.Repeat("é", 255), Connector: "webhook", Payload: map[string]int{"a": 1}},
		{Key: "with-headers", Connector: "webhook", Payload: []int{1}, Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
		// Slack carries the key in the message's JSON metadata, which keeps it as it is.
		{Key: " spaced key\t", Connector: "slack", Payload: map[string]string{"channel": "C01", "text": "hi"}},
		// A surrogate pair, and an escaped backslash before "u0000", which jsonb stores.
		ok("webhook", `{"smile":"\ud83d\ude00","text":"\\u0000 and \\ud800"}`),
	}
	for i, m := range valid {
		t.Run(fmt.Sprintf("valid/%d/%s", i, m.Connector), func(t *testing.T) {
			t.Parallel()
			in, err := outbox.Enqueue(t.Context(), pgtest.Tx(t), m)
			require.NoError(t, err)
			require.True(t, in.Inserted)
		})
	}

	invalid := []struct {
		name string
		msg  outbox.Message
		want string
	}{
		{"empty key", outbox.Message{Connector: "webhook", Payload: []int{}}, "key is empty"},
		{"key too long", outbox.Message{Key: strings.Repeat("k", 256), Connector: "webhook", Payload: []int{}}, "256 characters"},
		{"empty connector", outbox.Message{Key: "k", Payload: []int{}}, "connector is empty"},
		// Sent as a header, the key would lose the space, or end the header.
		{"key ends in space", outbox.Message{Key: "k ", Connector: "webhook", Payload: []int{}}, `idempotency key "k " cannot be sent by the webhook connector: it begins or ends with white space`},
		{"key starts with tab", outbox.Message{Key: "\tk", Connector: "payment:eu", Payload: map[string]any{}}, "cannot be sent by the payment connector"},
		{"key with newline", outbox.Message{Key: "a\nb", Connector: "email", Payload: map[string]any{}}, "control characters"},
		{"unknown kind", ok("fax", `{}`), `unknown kind "fax"`},
		{"malformed connector", ok("Webhook:CRM", `{}`), "malformed"},
		{"nil payload", outbox.Message{Key: "k", Connector: "webhook"}, "payload is missing"},
		{"not json", ok("webhook", `{"a":`), "not valid JSON"},
		{"trailing data", ok("webhook", `{} {}`), "not valid JSON"},
		{"unencodable", outbox.Message{Key: "k", Connector: "webhook", Payload: make(chan int)}, "cannot be encoded"},
		{"webhook string", ok("webhook", `"hello"`), "object or array"},
		{"webhook named number", ok("webhook:crm", `12`), "object or array"},
		{"email not object", ok("email", `[]`), "must be a JSON object"},
		{"email no to", ok("email", `{"subject":"s","text":"t"}`), `needs "to"`},
		{"email empty to", ok("email", `{"to":[],"subject":"s","text":"t"}`), `needs "to"`},
		{"email bad to", ok("email", `{"to":["not an address"],"subject":"s","text":"t"}`), "does not parse"},
		{"email to number", ok("email", `{"to":5,"subject":"s","text":"t"}`), "address or a list"},
		{"email bad cc", ok("email", `{"to":"a@example.com","cc":["x"],"subject":"s","text":"t"}`), `"cc"`},
		{"email no subject", ok("email", `{"to":"a@example.com","text":"t"}`), "subject"},
		{"email no body", ok("email", `{"to":"a@example.com","subject":"s"}`), `"text" or "html"`},
		{"email subject newline", ok("email", `{"to":"a@example.com","subject":"Hi\r\nBcc: x@example.com","text":"t"}`), "one line"},
		{"email address newline", ok("email", `{"to":"a@example.com (Ann\nBcc: x@example.com)","subject":"s","text":"t"}`), "control characters"},
		{"email header newline", ok("email", `{"to":"a@example.com","subject":"s","text":"t","headers":{"X":"a\r\nBcc: x"}}`), "one-line"},
		{"slack no channel", ok("slack", `{"text":"t"}`), "channel"},
		{"slack no text", ok("slack", `{"channel":"C01"}`), `"text"`},
		{"slack empty blocks", ok("slack", `{"channel":"C01","blocks":[]}`), "blocks"},
		{"payment unknown op", ok("payment", `{"operation":"charge.everything","params":{}}`), "not one of"},
		{"payment no params", ok("payment", `{"operation":"refund.create"}`), "params"},
		{"payment params array", ok("payment", `{"operation":"refund.create","params":[]}`), "params"},
		{"bad header name", outbox.Message{Key: "k", Connector: "webhook", Payload: []int{}, Headers: map[string]string{"Bad Name": "x"}}, "header name"},
		{"header injection", outbox.Message{Key: "k", Connector: "webhook", Payload: []int{}, Headers: map[string]string{"traceparent": "x\r\nhost: evil"}}, "line break"},
		{"ordering key too long", outbox.Message{Key: "k", Connector: "webhook", Payload: []int{}, OrderingKey: strings.Repeat("o", 256)}, "ordering key"},
		// Valid JSON that jsonb refuses, and text PostgreSQL cannot hold: caught before
		// the INSERT, which would fail and abort the caller's transaction.
		{"payload NUL escape", ok("webhook", `{"a":"x\u0000y"}`), `\u0000`},
		{"payload lone high surrogate", ok("webhook", `{"a":"\ud800"}`), "half a surrogate pair"},
		{"payload lone low surrogate", ok("webhook", `["\udc00"]`), "half a surrogate pair"},
		{"payload high surrogate then other escape", ok("webhook", `["\ud800\u0041"]`), "half a surrogate pair"},
		{"payload not UTF-8", ok("webhook", "[\"\xff\"]"), "not UTF-8"},
		{"ordering key NUL", outbox.Message{Key: "k", Connector: "webhook", Payload: []int{}, OrderingKey: "a\x00b"}, "ordering key"},
	}
	for _, tt := range invalid {
		t.Run("invalid/"+tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			tx := pgtest.Tx(t)
			_, err := outbox.Enqueue(ctx, tx, tt.msg)
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.Contains(t, err.Error(), tt.want)
			require.Equal(t, 0, countRows(t, tx), "nothing is written, and the transaction is still usable")
		})
	}
}

func TestEnqueueNotBeforeAndHeaders(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	in, err := outbox.Enqueue(ctx, tx, outbox.Message{
		Key: "later", Connector: "webhook", Payload: []int{1}, NotBefore: at,
		Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	})
	require.NoError(t, err)
	require.True(t, in.NextAttemptAt.Equal(at))
	got, err := outbox.Get(ctx, tx, "later")
	require.NoError(t, err)
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", got.Headers["traceparent"])

	// Headers are not part of the request's identity: a retry with a new trace is the same.
	again, err := outbox.Enqueue(ctx, tx, outbox.Message{Key: "later", Connector: "webhook", Payload: []int{1}, NotBefore: at})
	require.NoError(t, err)
	require.False(t, again.Inserted)

	appr, err := outbox.Enqueue(ctx, tx, outbox.Message{Key: "needs-ok", Connector: "payment", RequireApproval: true, CreatedBy: "agent",
		Payload: map[string]any{"operation": "refund.create", "params": map[string]any{"payment_intent": "pi_1"}}})
	require.NoError(t, err)
	require.Equal(t, outbox.StatusAwaitingApproval, appr.Status)
	require.Equal(t, "agent", appr.CreatedBy)
}

func TestGetReturnsOutcome(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)

	_, err := outbox.Get(ctx, tx, "nope")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.Contains(t, err.Error(), `"nope"`)

	_, err = outbox.Enqueue(ctx, tx, webhookMsg("done", []int{1}))
	require.NoError(t, err)
	// What the relay writes when a delivery succeeds.
	_, err = tx.Exec(ctx, `UPDATE outbox SET status = 'delivered', attempts = 2, last_error = 'receiver answered 503',
		result = '{"status": 200, "body": "ok"}', delivered_at = now() WHERE idempotency_key = 'done'`)
	require.NoError(t, err)

	got, err := outbox.Get(ctx, tx, "done")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, got.Status)
	require.Equal(t, 2, got.Attempts)
	require.Equal(t, "receiver answered 503", got.LastError)
	require.JSONEq(t, `{"status": 200, "body": "ok"}`, string(got.Result))
	require.False(t, got.DeliveredAt.IsZero())
}

func TestEnqueueBatch(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		pool *pgxpool.Pool
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		return &testBundle{pool: pgtest.DB(t)}
	}

	t.Run("writes all in order", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		msgs := make([]outbox.Message, 100)
		for i := range msgs {
			msgs[i] = webhookMsg(outbox.Key("batch", fmt.Sprint(i)), map[string]int{"i": i})
		}
		out, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
		require.NoError(t, err)
		require.Len(t, out, 100)
		for i, in := range out {
			require.True(t, in.Inserted)
			require.Equal(t, msgs[i].Key, in.Key)
			if i > 0 {
				require.Greater(t, in.ID, out[i-1].ID, "ids follow the batch order")
			}
		}

		// Again: nothing new, every intent returned as existing.
		again, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
		require.NoError(t, err)
		for i, in := range again {
			require.False(t, in.Inserted)
			require.Equal(t, out[i].ID, in.ID)
		}
		require.Equal(t, 100, countRows(t, b.pool))
	})

	t.Run("repeated key in one batch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		out, err := outbox.EnqueueBatch(t.Context(), b.pool, []outbox.Message{
			webhookMsg("a", []int{1}), webhookMsg("b", []int{2}), webhookMsg("a", []int{1}),
		})
		require.NoError(t, err)
		require.True(t, out[0].Inserted)
		require.False(t, out[2].Inserted)
		require.Equal(t, out[0].ID, out[2].ID)
		require.Equal(t, 2, countRows(t, b.pool))
	})

	t.Run("conflict writes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		_, err := outbox.Enqueue(ctx, b.pool, webhookMsg("taken", []int{1}))
		require.NoError(t, err)

		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
		_, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{
			webhookMsg("new-1", []int{1}), webhookMsg("taken", []int{2}), webhookMsg("new-2", []int{3}),
		})
		require.ErrorIs(t, err, outbox.ErrKeyConflict)
		require.Contains(t, err.Error(), `"taken"`)
		require.Equal(t, 1, countRows(t, tx), "the savepoint undid the batch; the transaction is usable")

		// Within-batch conflict.
		_, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{webhookMsg("x", []int{1}), webhookMsg("x", []int{2})})
		require.ErrorIs(t, err, outbox.ErrKeyConflict)
		require.Equal(t, 1, countRows(t, tx))
	})

	t.Run("invalid message writes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := outbox.EnqueueBatch(t.Context(), b.pool, []outbox.Message{
			webhookMsg("ok", []int{1}), {Key: "bad", Connector: "email", Payload: map[string]any{}},
		})
		require.ErrorIs(t, err, outbox.ErrInvalidMessage)
		require.Contains(t, err.Error(), `message 1 (key "bad")`)
		require.Equal(t, 0, countRows(t, b.pool))
	})
}

// A concurrent transaction commits a conflicting key while the batch's insert waits on
// it: the batch must still write nothing.
func TestEnqueueBatchConflictRace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.DB(t)

	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
	_, err = outbox.Enqueue(ctx, other, webhookMsg("contended", []int{1}))
	require.NoError(t, err)

	mine, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer mine.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // cleanup
	var myPID int
	require.NoError(t, mine.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&myPID))

	done := make(chan error, 1)
	go func() {
		_, err := outbox.EnqueueBatch(ctx, mine, []outbox.Message{
			webhookMsg("fresh", []int{1}), webhookMsg("contended", []int{2}),
		})
		done <- err
	}()
	// Wait until the batch's insert is blocked on the other transaction's key.
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1`, myPID).Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, other.Commit(ctx))

	require.ErrorIs(t, <-done, outbox.ErrKeyConflict)
	var n int
	require.NoError(t, mine.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE idempotency_key = 'fresh'`).Scan(&n))
	require.Zero(t, n, "the batch's other rows were undone; the transaction is usable")
}
