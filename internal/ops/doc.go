// Package ops is the library behind outboxd's operator commands (status, list, inspect,
// replay, cancel, purge) and the matching HTTP API: the commands parse flags and print,
// and every query lives here.
//
//	rep, err := ops.Status(ctx, pool, time.Time{})
//	page, err := ops.List(ctx, pool, ops.Filter{Status: []string{"dead"}, Connector: "webhook"})
//	res, err := ops.Replay(ctx, pool, ops.Selection{Keys: []string{key}},
//		ops.ReplayOptions{Actor: "alice", Reason: "receiver fixed", DryRun: true})
//
// # Reading
//
// [Status] summarises rows per connector in one GROUP BY query and gives a verdict
// (see its doc for the rules). [List] pages through rows newest first with keyset
// pagination and an opaque cursor; every filter is a query parameter, never SQL text.
// [Inspect] shows one row with its attempts and its audit trail.
//
// # Changing rows while relays run
//
// [Replay], [Cancel] and [Purge] may run at any time, against any number of running
// relays. Each works in batches, each batch a short transaction that locks its rows with
// FOR UPDATE SKIP LOCKED, then decides from the status it read under the lock:
//
//   - A row a relay is recording an outcome for is locked by the relay's transaction; the
//     command skips it and reports it refused, so the relay's outcome is never overwritten.
//   - A row in flight (delivering with a live lease) is refused: its relay's outcome
//     decides. Only a stuck row, whose lease has expired, is replayed.
//   - The relay's claim also uses SKIP LOCKED, so it never takes a row a command holds,
//     and sees the command's change once it commits.
//
// Every command is idempotent: replaying a pending row, cancelling a canceled one and
// purging twice change nothing the second time, and results say which keys were
// unchanged. Commands that change rows take an actor and a reason and write one
// outbox_audit row per changed row (purging whole rows deletes their audit rows with
// them).
//
// # Replaying and duplicates
//
// Replay keeps the key: a row goes back to pending and its next attempt carries the same
// idempotency key as before, so a receiver that enforces keys answers with what it
// already did. [GuaranteeNote] says what that means for each connector guarantee, and
// delivered rows are replayed only when asked explicitly (ReplayOptions.Redeliver).
// ReplayOptions.NewKey instead re-executes the operation as a new row under a derived
// key, leaving the old row and its record alone.
package ops
