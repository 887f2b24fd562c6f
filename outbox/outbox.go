package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sentinel errors; test for them with errors.Is.
var (
	// ErrKeyConflict means the idempotency key already names a different request
	// (another connector, payload or ordering key). The message names the key.
	ErrKeyConflict = errors.New("idempotency key already used for a different request")

	// ErrInvalidMessage means the message was refused before anything was written.
	// The message says what is wrong.
	ErrInvalidMessage = errors.New("invalid message")

	// ErrNotFound means no intent has the key.
	ErrNotFound = errors.New("intent not found")
)

// Statuses of an intent; relay/doc.go sets out the state machine.
const (
	StatusPending          = "pending"
	StatusDelivering       = "delivering"
	StatusDelivered        = "delivered"
	StatusDead             = "dead"
	StatusCanceled         = "canceled"
	StatusAwaitingApproval = "awaiting_approval"
	StatusHeld             = "held"
)

// DB is what Enqueue and Get need of a database handle. [pgx.Tx], [*pgx.Conn] and
// [*pgxpool.Pool] satisfy it; pass the transaction that changes your own state.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Message is an intent to enqueue: one logical operation, named by Key.
type Message struct {
	// Key is the idempotency key: 1 to 255 characters (bytes for the payment connector,
	// as Stripe counts them), derived from the work (see [Key]). For every connector but
	// slack it travels as a header, so it must not hold control characters or begin or
	// end with white space.
	Key string
	// Connector is the connector instance that delivers it: "webhook", "email", "slack",
	// "payment", or a named instance such as "webhook:crm".
	Connector string
	// Payload is what the connector needs. []byte and json.RawMessage are taken as JSON
	// text; any other value is encoded with encoding/json.
	Payload any
	// OrderingKey, when set, makes rows sharing it deliver one at a time in enqueue order.
	OrderingKey string
	// NotBefore delays the first attempt. Zero means now.
	NotBefore time.Time
	// Headers travel with the row to the receiver, such as a W3C "traceparent".
	// Names are lowercase. Headers are not part of the request's identity. The webhook
	// connector sends them with its request; slack, email and payment do not (see each
	// connector's package documentation).
	Headers map[string]string
	// RequireApproval makes the intent start awaiting_approval instead of pending.
	RequireApproval bool
	// CreatedBy names who asked for the intent (an API token's name); informational.
	CreatedBy string
}

// Intent is a row of the outbox table: a message and what has happened to it.
type Intent struct {
	ID          int64             `json:"id"`
	Key         string            `json:"key"`
	Connector   string            `json:"connector"`
	Status      string            `json:"status"`
	Payload     json.RawMessage   `json:"payload,omitempty"`
	OrderingKey string            `json:"ordering_key,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	CreatedBy   string            `json:"created_by,omitempty"`
	// Attempts counts the delivery attempts started so far.
	Attempts int `json:"attempts"`
	// LastError is the latest failure, written for a person to act on.
	LastError string `json:"last_error,omitempty"`
	// Result is the receiver's stored answer (status code, provider id, body excerpt).
	Result        json.RawMessage `json:"result,omitempty"`
	NextAttemptAt time.Time       `json:"next_attempt_at"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	// DeliveredAt is zero until the intent is delivered.
	DeliveredAt time.Time `json:"delivered_at,omitzero"`

	// Inserted is true when this call wrote the row, false when the key already existed
	// with the same request.
	Inserted bool `json:"-"`
}

// WaitingBehind is the last_error of a row the relay parked behind row id (whose
// idempotency key is key, which operators act on), an earlier row of its ordering key
// whose attempt failed and waits for its retry. The parked row cannot go before that
// retry, so it takes the retry's time as its next_attempt_at, and claims stop reading it
// again and again until then. Only rows never attempted and
// already due are parked, so their own schedule has passed. Canceling row id (ops.Cancel)
// makes them due again at once, and the claim that takes one clears the text.
func WaitingBehind(id int64, key string) string {
	return ParkedBehind(id) + fmt.Sprintf("%q), whose failed attempt is retried first", key)
}

// WaitingForOperator is the last_error of a row the relay parked behind row id (key
// key), an earlier row of its ordering key that is held or awaits approval, which only an
// operator ends. The parked row's next_attempt_at is a minute ahead, renewed while row
// id waits, so that claims do not read it again and again meanwhile. Replaying,
// approving, rejecting or canceling row id (package ops) makes it due at once, and so
// does a late delivery of row id when it is the key's next row (the relay makes that
// row due in the outcome's transaction); a row id ended otherwise (plain SQL) lets it go
// within that minute.
func WaitingForOperator(id int64, key string) string {
	return ParkedBehind(id) + fmt.Sprintf("%q), which waits for an operator (held, or awaiting approval)", key)
}

// WaitingForDelivery is the last_error of a row the relay parked behind row id (key
// key), an earlier row of its ordering key that a relay is delivering. The parked row's
// next_attempt_at is a minute ahead, renewed while rows of its key are in flight, so
// that a key's backlog is not read again by every claim while it goes out one row at a
// time. When a row of the key finishes (delivered, dead), the relay makes the key's next
// parked row due at once, whichever row its text names, and so does an operator's
// cancel or reject of the key's first row not finished; a row id ended otherwise lets
// it go within that minute. The text says row id was in flight when the row was parked,
// not that it still is: the rows behind it keep the text as the rows of the key ahead of
// them go out, until the parking is renewed (within the minute) behind the row then in
// flight.
func WaitingForDelivery(id int64, key string) string {
	return ParkedBehind(id) + fmt.Sprintf("%q), in flight when this row was parked; the key's rows go out one at a time", key)
}

// ParkedBehind is how the last_error of a row parked behind row id begins
// ([WaitingBehind], [WaitingForOperator], [WaitingForDelivery]): what an operator's decision on row id
// looks for to release the rows parked behind it.
func ParkedBehind(id int64) string {
	return ParkedPrefix + strconv.FormatInt(id, 10) + " of its ordering key (key "
}

// ParkedPrefix begins the last_error of every parked row ([ParkedBehind]). A row never
// attempted whose last_error begins so is parked: the claim, the parking and cancel find
// them by it in SQL.
const ParkedPrefix = "waiting behind row "

// IntentColumns lists, in [ScanIntent]'s order, the outbox columns an Intent reads.
const IntentColumns = `id, idempotency_key, connector, payload, status, attempts, next_attempt_at,
	coalesce(last_error, ''), result, coalesce(ordering_key, ''), headers, coalesce(created_by, ''),
	created_at, updated_at, delivered_at`

// ScanIntent scans a row selected with [IntentColumns], plus any extra destinations.
// A time that plain SQL wrote as ±infinity, which time.Time cannot hold, or past the
// years JSON can carry (PostgreSQL takes 4713 BC to 294276 AD), reads as the latest or
// earliest time JSON can carry (9999-12-31T23:59:59.999999Z, 0000-01-01T00:00:00Z).
func ScanIntent(row pgx.Row, extra ...any) (Intent, error) {
	var (
		in                                        Intent
		nextAt, createdAt, updatedAt, deliveredAt pgtype.Timestamptz
		// Read as bytes, not into json.RawMessage, which pgx fills through
		// json.Unmarshal: that refuses values nested deeper than 10,000 levels, which
		// jsonb takes (plain SQL can write them), and one such row failed every read of it.
		payload, result, headers []byte
	)
	dest := append([]any{
		&in.ID, &in.Key, &in.Connector, &payload, &in.Status, &in.Attempts, &nextAt,
		&in.LastError, &result, &in.OrderingKey, &headers, &in.CreatedBy,
		&createdAt, &updatedAt, &deliveredAt,
	}, extra...)
	if err := row.Scan(dest...); err != nil {
		return Intent{}, err
	}
	in.Payload, in.Result = payload, result
	in.NextAttemptAt, in.CreatedAt, in.UpdatedAt = FiniteTime(nextAt), FiniteTime(createdAt), FiniteTime(updatedAt)
	if deliveredAt.Valid {
		in.DeliveredAt = FiniteTime(deliveredAt)
	}
	in.Headers = DecodeHeaders(headers)
	if len(in.Headers) == 0 {
		in.Headers = nil
	}
	return in, nil
}

// infiniteTime and negativeInfiniteTime stand for a timestamp that is 'infinity' or
// '-infinity' in the table: the latest and earliest times JSON can carry.
var (
	infiniteTime         = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
	negativeInfiniteTime = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
)

// FiniteTime is t's time as [ScanIntent] reads a row's times: ±infinity (plain SQL can
// write it, and time.Time cannot hold it), and times past them, as the latest and
// earliest times JSON can carry (time.Time's MarshalJSON fails outside them, and with it
// every JSON answer holding the row); zero when t is NULL.
func FiniteTime(t pgtype.Timestamptz) time.Time {
	switch {
	case !t.Valid:
		return time.Time{}
	case t.InfinityModifier == pgtype.Infinity || t.Time.After(infiniteTime):
		return infiniteTime
	case t.InfinityModifier == pgtype.NegativeInfinity || t.Time.Before(negativeInfiniteTime):
		return negativeInfiniteTime
	case t.Time.Year() < 0 || t.Time.Year() > 9999:
		// Within them, but read in a zone (time.Local) whose offset carries it past the
		// years JSON can carry: 9999-12-31 23:30Z is 10000-01-01 at +01:00.
		return t.Time.UTC()
	}
	return t.Time
}

// insertSQL writes one intent unless its key exists. ON CONFLICT DO NOTHING waits for a
// concurrent insert of the same key to commit or roll back, so concurrent enqueues of one
// key yield one row and no unique-violation error (which would abort the caller's
// transaction).
const insertSQL = `
INSERT INTO outbox (idempotency_key, connector, payload, ordering_key, next_attempt_at,
                    fingerprint, headers, status, created_by)
VALUES ($1, $2, $3, NULLIF($4, ''), coalesce($5, now()), $6, $7, $8, NULLIF($9, ''))
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING ` + insertedColumns

// insertedColumns are what an insert returns; the rest of the Intent is the message.
const insertedColumns = `id, idempotency_key, status, next_attempt_at, created_at, updated_at`

// insertBatchSQL is insertSQL for many messages in one statement. Ids are drawn in the
// given order (rows sharing an ordering key are delivered in id order), but rows are
// inserted in key order, so that two batches holding some of the same keys take their
// locks in one order and wait for each other instead of deadlocking. (The subquery draws
// the ids as it reads the messages in their order, which ORDER BY ord makes sure of; the
// outer sort comes after. TestBatchIdsInBatchOrder checks it.)
const insertBatchSQL = `
INSERT INTO outbox (id, idempotency_key, connector, payload, ordering_key, next_attempt_at,
                    fingerprint, headers, status, created_by)
SELECT i, k, c, p, NULLIF(o, ''), coalesce(n, now()), f, h, s, NULLIF(b, '')
FROM (SELECT m.*, nextval(pg_get_serial_sequence('outbox', 'id')) AS i
      FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::text[], $5::timestamptz[],
                  $6::bytea[], $7::jsonb[], $8::text[], $9::text[])
           WITH ORDINALITY AS m(k, c, p, o, n, f, h, s, b, ord)
      ORDER BY ord) AS m
ORDER BY k, ord
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING ` + insertedColumns

// undoBatchSQL removes the rows a batch inserted in the caller's transaction when one of
// its keys turned out to name a different request: a batch is all or nothing, without
// paying a savepoint's round trips on the common path.
const undoBatchSQL = `DELETE FROM outbox WHERE id = ANY($1)`

// undoTimeout bounds undoBatchSQL, which runs after the caller's context ended too; it
// deletes only rows of the caller's transaction, which no one else can hold.
const undoTimeout = 10 * time.Second

// existingSQL reads the rows already holding some keys and says whether each holds the
// same request: the same connector, ordering key and a payload equal as jsonb (which
// ignores key order and whitespace and compares numbers by exact value, as the canonical
// form does). The fingerprint is not trusted for this: rows written by plain SQL have
// none, and those written before numbers were canonicalised exactly may have one that
// rounded a number through float64. It is the only record left of a row whose payload
// `purge --payload-only` replaced with {}, and is compared then, alone: a request with
// payload {} is not the purged row's request unless the fingerprint says so. As the
// fingerprint covers the connector and ordering key too, it tells of the payload only
// when those are the same; otherwise they are what a conflict names.
const existingSQL = `
SELECT ` + IntentColumns + `,
       m.k,
       o.connector = m.c,
       CASE WHEN o.payload = '{}'::jsonb AND o.fingerprint IS NOT NULL
            THEN o.fingerprint = m.f OR o.connector <> m.c OR o.ordering_key IS DISTINCT FROM NULLIF(m.o, '')
            ELSE o.payload = m.p END,
       o.ordering_key IS NOT DISTINCT FROM NULLIF(m.o, '')
FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::text[], $5::bytea[]) AS m(k, c, p, o, f)
JOIN outbox o ON o.idempotency_key = m.k`

// Enqueue writes an intent inside db, normally the caller's own transaction: nothing is
// visible to the relay before that transaction commits, and a rollback removes it.
//
// If the key already exists with the same request (connector, payload compared in
// canonical form, ordering key), Enqueue returns the existing intent with Inserted false
// and no error. If it exists with a different request, the error wraps [ErrKeyConflict].
// An invalid message is refused before anything is written, with an error wrapping
// [ErrInvalidMessage]; neither case aborts the caller's transaction. But a message that
// a rule refuses whose key already holds the same request, written before that rule (by
// an older outboxd, or by plain SQL), is that intent, returned as above: its stored
// outcome is the answer to the key. In a REPEATABLE READ or SERIALIZABLE transaction, a
// key that another transaction committed after the caller's snapshot was taken cannot
// be read, and PostgreSQL fails the statement with a serialization failure (SQLSTATE
// 40001): retry the whole transaction, as for any serialization failure. When db is no
// transaction (a pool, or a connection outside one), the statement is its own
// transaction, and Enqueue retries it itself whatever the session's default isolation
// (not through a DB type of your own, which may wrap a transaction).
func Enqueue(ctx context.Context, db DB, m Message) (Intent, error) {
	p, err := prepare(m)
	if err != nil {
		if p, ok := lookupForm(m); ok {
			return writtenBefore(ctx, db, p, err)
		}
		return Intent{}, err
	}
	// A row deleted between the conflict and the lookup (retention) makes the lookup
	// miss; inserting again then succeeds, so a second pass settles it.
	for range 2 {
		var in Intent
		// Of a DB it cannot see into, which may wrap the caller's transaction, it retries
		// nothing: a second statement in an aborted transaction fails with 25P02, which
		// hides the 40001 the caller retries on.
		own := txStatus(db) == 'I'
		err := retryOwnTx(func() bool { return own }, func() (err error) {
			in, err = scanInserted(db.QueryRow(ctx, insertSQL, p.Key, p.Connector, string(p.payload), p.OrderingKey,
				notBefore(p.NotBefore), p.fingerprint, headersJSON(p.Headers), initialStatus(p.Message), p.CreatedBy),
				func(string) prepared { return p })
			return err
		})
		if err == nil {
			return in, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Intent{}, fmt.Errorf("enqueue %q: %w", p.Key, err)
		}
		found, err := existing(ctx, db, []prepared{p})
		if err != nil {
			return Intent{}, err
		}
		if in, ok := found[p.Key]; ok {
			return in, nil
		}
	}
	return Intent{}, fmt.Errorf("enqueue %q: the existing row vanished twice while being compared", p.Key)
}

// writtenBefore answers a message that prepare refused with err, whose lookupForm is p,
// with the intent that holds its key when that intent holds the message's request: a row
// written before the rule that refuses it (see lookupForm). Its stored outcome is the
// answer to the key, as for any request asked again; told err, a step retried after an
// upgrade would take its written, perhaps delivered, request for one never made.
// Otherwise, err: nothing is written.
func writtenBefore(ctx context.Context, db DB, p prepared, err error) (Intent, error) {
	found, lookupErr := existing(ctx, db, []prepared{p})
	if lookupErr != nil && !errors.Is(lookupErr, ErrKeyConflict) {
		return Intent{}, fmt.Errorf("%w (and looking for the key's intent: %w)", err, lookupErr)
	}
	if in, ok := found[p.Key]; ok {
		return in, nil
	}
	return Intent{}, err
}

// EnqueueBatch writes many intents in one statement, with [Enqueue]'s rules for each
// message; the returned intents are in the order of msgs. It is atomic: when any message
// is invalid or conflicts, nothing of the batch is written, and the caller's transaction
// stays usable. A key repeated within the batch counts as a re-enqueue of the first.
// That holds when ctx ends midway too: in the caller's transaction, the rows already
// written are removed before EnqueueBatch returns, in one more statement that does not
// heed ctx and may hold the return up to 10 s when the database does not answer. But
// when ctx ends while a statement of the batch runs, the caller's transaction cannot go
// on (pgx closes the connection by default, or the cancelled statement aborts the
// transaction): nothing of the batch is written, and nothing of the caller's work either.
// Outside a transaction EnqueueBatch writes in a transaction of its own, and retries a
// serialization failure or a deadlock itself when it knows that transaction is its own:
// begun on a pool (through a DB type of yours that wraps one too) or on a connection
// outside a transaction. Through a DB type of yours, which the package cannot see into
// (whether it wraps a pool, a connection or a transaction), one more statement tells
// whether its session is in a transaction: its rows must name their connection
// ([pgx.Rows.Conn]), as pgx's do.
func EnqueueBatch(ctx context.Context, db DB, msgs []Message) ([]Intent, error) {
	ps := make([]prepared, len(msgs))
	first := make(map[string]prepared, len(msgs)) // each key's first message
	// refused[i] is why prepare refused message i, which a row written before may answer
	// (see writtenBefore): it is not written, and the batch fails unless its row is found.
	refused := make([]error, len(msgs))
	for i, m := range msgs {
		p, err := prepare(m)
		if err != nil {
			err = fmt.Errorf("message %d (key %q): %w", i, m.Key, err)
			var ok bool
			if p, ok = lookupForm(m); !ok {
				return nil, err
			}
			refused[i] = err
		}
		if f, ok := first[p.Key]; !ok {
			first[p.Key] = p
		} else if !bytes.Equal(f.fingerprint, p.fingerprint) {
			return nil, fmt.Errorf("message %d: %w: key %q appears twice in the batch with different requests",
				i, ErrKeyConflict, p.Key)
		}
		ps[i] = p
	}
	if len(ps) == 0 {
		return nil, nil
	}
	st, err := sessionTxStatus(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("enqueue batch: %w", err)
	}
	if st == 'T' || st == 'E' { // in a transaction, or in a failed one
		return enqueueBatch(ctx, db, ps, first, refused)
	}
	// Outside a transaction the undo would come too late: others could see the rows.
	// A transaction that a pool began is EnqueueBatch's own whatever db is (a DB of the
	// caller's that wraps the pool, say): a pool never hands out a session inside one.
	var out []Intent
	own := st == 'I'
	err = retryOwnTx(func() bool { return own }, func() error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) (err error) {
			if _, ok := tx.(*pgxpool.Tx); ok {
				own = true
			}
			out, err = enqueueBatch(ctx, tx, ps, first, refused)
			return err
		})
	})
	return out, err
}

// probeSQL is sent through a DB that txStatus cannot see into, for the connection its
// rows name.
const probeSQL = `SELECT`

// sessionTxStatus is the status of the session db sends on, for EnqueueBatch to tell
// whether db is the caller's transaction: a [pgx.Tx], or a connection ([*pgx.Conn],
// [*pgxpool.Conn]) whose session is inside a transaction begun with SQL (BEGIN), where a
// BEGIN of the package's own would not nest, and its COMMIT or ROLLBACK would end the
// caller's. So is a DB of the caller's that wraps such a connection (one that traces its
// statements, say), which txStatus cannot see into: for one, a statement is sent
// through it, and the session's status read from the connection its rows name
// ([pgx.Rows.Conn]), as pgx's rows do, while they hold it (a pool's goes back to the
// pool when they close). 0 when the rows name none.
func sessionTxStatus(ctx context.Context, db DB) (byte, error) {
	if st := txStatus(db); st != 0 {
		return st, nil
	}
	rows, err := db.Query(ctx, probeSQL)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	if c := rows.Conn(); c != nil {
		return c.PgConn().TxStatus(), nil
	}
	return 0, nil
}

// txStatus is the transaction status of the session db sends on, as PostgreSQL reports
// it ('I' outside a transaction, 'T' inside one, 'E' inside a failed one): 'T' for a
// [pgx.Tx], 'I' for a pool (it never hands out a session inside a transaction), the
// session's own for a connection, and 0 for any other DB, such as a wrapper of the
// caller's, which may wrap a transaction or not.
func txStatus(db DB) byte {
	switch c := db.(type) {
	case pgx.Tx:
		return 'T'
	case *pgxpool.Pool:
		return 'I'
	case interface{ PgConn() *pgconn.PgConn }: // *pgx.Conn
		return c.PgConn().TxStatus()
	case interface{ Conn() *pgx.Conn }: // *pgxpool.Conn
		return c.Conn().PgConn().TxStatus()
	}
	return 0
}

// ownTxRetries is how many times retryOwnTx tries again.
const ownTxRetries = 3

// retryOwnTx runs f and runs it again after a serialization failure (SQLSTATE 40001)
// or a deadlock (40P01) when own reports that the transaction that failed is known to be
// Enqueue's own (an autocommit statement on a pool or a connection outside a
// transaction) or EnqueueBatch's, so that nothing of it was written. Where the session's
// default isolation is REPEATABLE READ or SERIALIZABLE, a key that another transaction
// commits while the insert waits on it fails the insert so; a new snapshot sees the
// row, and the caller, who holds no transaction to retry, gets the existing intent or
// ErrKeyConflict, as under READ COMMITTED. A batch takes its keys in key order, but a
// transaction that enqueues one key and then another (or plain SQL) takes them in its
// own, and PostgreSQL may end the batch's transaction as the deadlock's victim; the
// other one has then gone on, and the batch, begun again, waits for it. In the caller's
// transaction the failure is the caller's to retry.
func retryOwnTx(own func() bool, f func() error) error {
	for n := 0; ; n++ {
		err := f()
		var pgErr *pgconn.PgError
		if n == ownTxRetries || !errors.As(err, &pgErr) || (pgErr.Code != "40001" && pgErr.Code != "40P01") || !own() {
			return err
		}
	}
}

func enqueueBatch(ctx context.Context, tx DB, ps []prepared, first map[string]prepared, refused []error) ([]Intent, error) {
	// The messages prepare refused are answered by the rows written before, or the batch
	// fails before anything is written. One at a time: a conflict ends a lookup.
	for i, p := range ps {
		if refused[i] == nil {
			continue
		}
		if _, err := writtenBefore(ctx, tx, p, refused[i]); err != nil {
			return nil, err
		}
	}
	var (
		keys, connectors, orderingKeys, statuses, createdBy []string
		payloads, headers                                   []string
		fingerprints                                        [][]byte
		notBefores                                          []*time.Time
	)
	for i, p := range ps {
		if refused[i] != nil {
			continue // never written: its row, found above, is compared below
		}
		keys, connectors, orderingKeys = append(keys, p.Key), append(connectors, p.Connector), append(orderingKeys, p.OrderingKey)
		statuses, createdBy = append(statuses, initialStatus(p.Message)), append(createdBy, p.CreatedBy)
		payloads, headers, fingerprints = append(payloads, string(p.payload)), append(headers, headersJSON(p.Headers)), append(fingerprints, p.fingerprint)
		notBefores = append(notBefores, notBefore(p.NotBefore))
	}

	rows, err := tx.Query(ctx, insertBatchSQL, keys, connectors, payloads, orderingKeys, notBefores,
		fingerprints, headers, statuses, createdBy)
	if err != nil {
		return nil, fmt.Errorf("enqueue batch: %w", err)
	}
	byKey := make(map[string]Intent, len(ps))
	var ids []int64
	// undo removes the batch's rows from the caller's transaction before an error is
	// returned: whatever the error, nothing of the batch stays written. Even when ctx
	// has ended (the error may be that): the transaction is still healthy when nothing
	// was sent under the ended ctx, and the caller may commit its own work under another.
	undo := func(err error) error {
		if len(ids) > 0 {
			undoCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
			defer cancel()
			if _, undoErr := tx.Exec(undoCtx, undoBatchSQL, ids); undoErr != nil {
				return errors.Join(err, fmt.Errorf("undo the batch's rows: %w", undoErr))
			}
		}
		return err
	}
	for rows.Next() {
		in, err := scanInserted(rows, func(key string) prepared { return first[key] })
		if err != nil {
			rows.Close()
			return nil, undo(fmt.Errorf("enqueue batch: %w", err))
		}
		byKey[in.Key] = in
		ids = append(ids, in.ID)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("enqueue batch: %w", err)
	}

	// Every message the insert did not write, including repeats of a key within the
	// batch, is compared with the row that holds its key.
	var rest []prepared
	seen := make(map[string]bool, len(ps))
	for _, p := range ps {
		if _, ok := byKey[p.Key]; !ok || seen[p.Key] {
			rest = append(rest, p)
		}
		seen[p.Key] = true
	}
	found, err := existing(ctx, tx, rest)
	if err != nil {
		return nil, undo(err)
	}
	out := make([]Intent, len(ps))
	for i, p := range ps {
		in, ok := byKey[p.Key]
		if ok {
			delete(byKey, p.Key) // a repeat of this key later in the batch is not "inserted"
		} else if in, ok = found[p.Key]; !ok {
			// Its row was deleted (retention) between the insert and the lookup.
			return nil, undo(fmt.Errorf("enqueue batch: key %q neither inserted nor found; retry the batch", p.Key))
		}
		out[i] = in
	}
	return out, nil
}

// scanInserted reads a row of insertedColumns and fills the rest of the Intent from the
// message that was written, which msg returns for the row's key.
func scanInserted(row pgx.Row, msg func(key string) prepared) (Intent, error) {
	var (
		in                           Intent
		nextAt, createdAt, updatedAt pgtype.Timestamptz
	)
	if err := row.Scan(&in.ID, &in.Key, &in.Status, &nextAt, &createdAt, &updatedAt); err != nil {
		return Intent{}, err
	}
	// As ScanIntent reads them: a NotBefore near year 9999's end is past it east of UTC.
	in.NextAttemptAt, in.CreatedAt, in.UpdatedAt = FiniteTime(nextAt), FiniteTime(createdAt), FiniteTime(updatedAt)
	p := msg(in.Key)
	in.Connector, in.Payload, in.OrderingKey, in.CreatedBy = p.Connector, p.payload, p.OrderingKey, p.CreatedBy
	if len(p.Headers) > 0 {
		in.Headers = p.Headers
	}
	in.Inserted = true
	return in, nil
}

// existing looks up the rows holding the keys of ps and checks that each holds the same
// request. Keys without a row are absent from the map.
func existing(ctx context.Context, db DB, ps []prepared) (map[string]Intent, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	keys, conns, ords := make([]string, len(ps)), make([]string, len(ps)), make([]string, len(ps))
	payloads, fps := make([]string, len(ps)), make([][]byte, len(ps))
	for i, p := range ps {
		keys[i], conns[i], ords[i], payloads[i], fps[i] = p.Key, p.Connector, p.OrderingKey, string(p.payload), p.fingerprint
	}
	rows, err := db.Query(ctx, existingSQL, keys, conns, payloads, ords, fps)
	if err != nil {
		return nil, fmt.Errorf("look up existing keys: %w", err)
	}
	defer rows.Close()
	found := make(map[string]Intent, len(ps))
	for rows.Next() {
		var (
			key  string
			same [3]bool // connector, payload, ordering key
		)
		in, err := ScanIntent(rows, &key, &same[0], &same[1], &same[2])
		if err != nil {
			return nil, fmt.Errorf("look up existing keys: %w", err)
		}
		var differs []string
		for i, what := range []string{"connector", "payload", "ordering key"} {
			if !same[i] {
				differs = append(differs, what)
			}
		}
		if n := len(differs); n > 0 {
			what, verb := differs[0], "differs"
			if n > 1 {
				what, verb = strings.Join(differs[:n-1], ", ")+" and "+differs[n-1], "differ"
			}
			return nil, fmt.Errorf("%w: key %q already names a %s intent (created %s) whose %s %s; use a new key for a different operation",
				ErrKeyConflict, key, in.Connector, in.CreatedAt.UTC().Format(time.RFC3339), what, verb)
		}
		found[key] = in
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up existing keys: %w", err)
	}
	return found, nil
}

// getSQL reads one intent by key.
const getSQL = `SELECT ` + IntentColumns + ` FROM outbox WHERE idempotency_key = $1`

// Get returns the intent with key: its status, attempts, last error and the receiver's
// stored result. Ask Get instead of acting again. The error wraps [ErrNotFound] when no
// intent has the key.
func Get(ctx context.Context, db DB, key string) (Intent, error) {
	if checkKey(key) != nil {
		// No row can hold it (and PostgreSQL refuses text that is not UTF-8 or holds NUL).
		return Intent{}, fmt.Errorf("%w: no intent has key %q", ErrNotFound, key)
	}
	in, err := ScanIntent(db.QueryRow(ctx, getSQL, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Intent{}, fmt.Errorf("%w: no intent has key %q", ErrNotFound, key)
	}
	if err != nil {
		return Intent{}, fmt.Errorf("get %q: %w", key, err)
	}
	return in, nil
}

func initialStatus(m Message) string {
	if m.RequireApproval {
		return StatusAwaitingApproval
	}
	return StatusPending
}

func notBefore(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// headersJSON is the headers column's value for h, as JSON text: the simple protocol
// sends a []byte argument as bytea, which jsonb refuses.
func headersJSON(h map[string]string) string {
	if len(h) == 0 {
		return `{}`
	}
	b, _ := json.Marshal(h) // a map of strings always encodes
	return string(b)
}

// DecodeHeaders reads the headers column, a JSON object. A value that is not a string,
// which plain SQL can write, is kept as its JSON text, so that one odd row can still be
// read, re-enqueued, listed and claimed (the connector decides what is valid); a null
// reads as the empty string, as an absent value.
func DecodeHeaders(b []byte) map[string]string {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) == 0 {
		return nil
	}
	out := make(map[string]string, len(raw))
	for name, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			s = string(v)
		}
		out[name] = s
	}
	return out
}
