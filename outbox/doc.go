// Package outbox is what applications call to write intents into the outbox table, inside
// the same transaction that changes their own state.
//
// An application never performs a side effect (a webhook, a charge, an email, a Slack
// post) directly. It enqueues an intent in its transaction; if the transaction rolls back
// the intent never existed, and if it commits the outboxd relay delivers it, retrying with
// the same idempotency key until the receiver answers, and stores that answer against the
// key.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, orderID); err != nil {
//			return err
//		}
//		_, err := outbox.Enqueue(ctx, tx, outbox.Message{
//			Key:       outbox.Key("order", orderID, "notify-crm"),
//			Connector: "webhook:crm",
//			Payload:   map[string]any{"order": orderID, "state": "paid"},
//		})
//		return err // a rollback removes the intent too
//	})
//
// The package depends only on pgx, starts no goroutines and never logs.
//
// # Choosing a key
//
// The key names one logical operation. It is decided once, when the workflow decides to
// act, and derived from the work itself: the run, the step, the target. [Key] builds one
// from such parts.
//
// A key must never contain a timestamp, an attempt number or a random value. Suppose a
// checkout handler charges a card and its process crashes after the commit of the first
// request but before it answered the client. The client retries the request:
//
//	outbox.Key("checkout", cartID, "charge")                          // good: the retry computes the same key
//	outbox.Key("checkout", cartID, "charge", time.Now().String())     // bad: a new key every time
//	outbox.Key("checkout", cartID, "charge", strconv.Itoa(attempt))   // bad: a new key every attempt
//
// With the good key the retry's Enqueue finds the existing intent and returns it (Inserted
// is false), and the payment provider, which dedupes on the key, charges once. With either
// bad key the retry is a new operation as far as everyone downstream can tell, and the
// customer is charged twice. The relay's own retries always reuse the row's key; the
// application's key must be just as stable across its own retries.
//
// # Same key, same request
//
// Enqueueing the same key again with the same request (connector, payload, ordering key)
// returns the existing intent with Inserted false: re-running a step is harmless. The
// payload is compared in canonical form, so JSON key order, whitespace and number
// spelling do not matter. The same key with a different request is an error wrapping
// [ErrKeyConflict]: the key already names another operation.
//
// # Asking again instead of acting again
//
// [Get] returns an intent's status, attempts, last error and the receiver's stored result,
// so a process that is unsure whether something happened asks instead of acting again.
//
// # Plain SQL
//
// The table is the API for other languages: a plain
//
//	INSERT INTO outbox (idempotency_key, connector, payload) VALUES ($1, $2, $3)
//	ON CONFLICT DO NOTHING
//
// produces a claimable row; the table's defaults and constraints do the rest, and a
// trigger wakes the relay. ON CONFLICT DO NOTHING lets the step run again: without it, a
// second insert of the key fails and aborts the transaction.
package outbox
