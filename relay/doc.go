// Package relay is the outboxd engine: it claims due rows from the outbox table with a
// lease, delivers them through connectors, and records each outcome and attempt.
//
//	r, err := relay.New(pool, &relay.Config{Logger: logger}, map[string]relay.Instance{
//		"webhook": {Connector: hook},
//	})
//	...
//	err = r.Run(ctx) // returns once ctx is done and in-flight deliveries are settled
//
// # The state machine
//
//	awaiting_approval --approve--> pending --claim--> delivering --ok--> delivered
//	        |                        ^  |                 |  \--retryable--> pending (next_attempt_at = now + backoff)
//	        +--reject--> canceled    |  +--cancel--> canceled  \--permanent or attempts/age exhausted--> dead
//	                                 +----------- replay (dead, or delivering whose lease expired) ------+
//
// The table is authoritative. A relay holds a row only through its lease (lease_owner,
// lease_expires_at, status delivering); every change it makes is conditional on still
// holding that lease for the same attempt, so a relay that lost its lease can never
// overwrite the work of the relay that took the row after it. One exception: a late
// delivery of an attempt whose lease expired is still recorded while the row, put back
// as ambiguous (pending, held, or dead when that was its last attempt), has not been
// taken again, even over an operator's replay or cancel: the receiver acted, and that
// is the truth. A row put away as dead also takes a late final refusal (dead); any other
// late answer goes to the attempts log only (see recordSQL).
//
// # Claiming
//
// One statement claims a batch: SELECT ... FOR UPDATE SKIP LOCKED picks due rows of a
// connector and the UPDATE leases them, so relays sharing a database never take the same
// row. The relay works in rounds: each round writes the outcomes gathered since the last
// one and claims for every instance with room, in one transaction and one round trip. A
// write of outcomes waits at most a second for a row's lock: an outcome whose row (or its
// ordering key's next row) another session keeps locked is set aside until the lock is
// let go, and the other outcomes are written apart from the claims (see writeAround).
// A hand-back of rows claimed but not started takes no lock wait at all: a row another
// session keeps locked is skipped and set aside, handed back once the lock is let go
// (see setAsideRelease).
//
// Deliveries in flight never exceed Config.Concurrency, nor an instance's Concurrency;
// with two or more instances (and at least two slots for each), each keeps one of the
// Config.Concurrency slots to itself, so one slow receiver, whose attempts take every
// slot they may, never starves the others. A rate-limited instance is claimed no faster
// than its rate. So that workers do not idle while a claim
// is on its way, a relay claims up to twenty rounds of an instance's deliveries ahead
// (at most twenty claims of Config.BatchSize rows), fewer when its recent attempts are
// slow: a row waits only while the instance's workers are busy. Only connectors that
// declare their time limit (connectors.Timeouter) are claimed ahead, and not those
// whose ambiguous attempts are held or whose rate is limited. Any row that waited too
// long to still finish well inside its lease, for a worker or for one of the
// Config.Concurrency slots that other instances' attempts hold, is handed back unsent
// (outboxd_claims_handed_back_total), the slot's wait included.
//
// Config.MaxClaimedBytes bounds the payload and header bytes of the rows a relay holds
// claimed (outboxd_claimed_payload_bytes), so that large payloads cannot exhaust its
// memory. A
// claim stops at what is left but always takes one row; while less than a quarter is
// left, only instances that hold no rows claim, so one instance's large payloads never
// stop the others.
//
// A claim starts its index scan a few seconds before the earliest row the instance's
// last claim took, not at the head of the index, where the entries of rows delivered
// since the last vacuum pile up; it starts at the head at least once every
// Config.PollInterval, and whenever a row may have turned due further back.
//
// The relay wakes on the NOTIFY that schema.sql's insert trigger sends, on a dedicated
// LISTEN connection that is re-established after it drops, or after it stays silent
// for 30 seconds and then does not answer a ping (connected with the pool's
// settings but outside it: one connection more than the pool's MaxConns; while it cannot
// connect, Ready fails), and otherwise every
// Config.PollInterval (which also picks up retries whose time has come). At start it
// sends itself a NOTIFY; when that does not arrive (a transaction-mode pooler in between)
// it logs one loud error and relies on polling.
//
// NOTIFY has a cost: PostgreSQL serialises the commits of every transaction that sends
// one, which caps how fast applications can commit single-row transactions. So a relay
// that has claimed rows within the last moments polls every few milliseconds instead and
// records that in outbox_wake_connectors, for each of its connector instances; each relay
// also renews there, every ten seconds, which instances it has. The insert trigger
// sends no NOTIFY while relays poll fast for every instance a running relay has: a relay
// idle while another is busy with other instances still hears of its rows at once. When
// the load stops the marks lapse (about two seconds) and inserts wake idle relays again;
// a relay that stops deletes its words at once (other relays' words about the same
// instances stand), and wakes the relays still running for the rows inserted under its
// mark that it left pending.
//
// Rows with an ordering key are delivered one at a time in id order: a row is due only
// when no earlier row of its key is pending, delivering, held or awaiting approval, and
// no later one is delivering (a dead head replayed while its key went on waits for the
// row in flight). A failing head therefore blocks only its own key. A dead or canceled
// row no longer holds its key back. A key's rows may be of different instances: a relay
// that ends a row whose key's next row is of an instance it does not have wakes the
// others (NOTIFY), since its own claims do not take that row. Ids are drawn at insert,
// not at commit: rows of one key inserted by concurrent transactions go out in the order
// their transactions commit only when those transactions are serialised (they update
// the same row first, say).
//
// # Outcomes
//
// Outcomes are recorded in batches, one statement for many rows, together with one
// outbox_attempts row per attempt; an outcome waits at most a few milliseconds for the
// next round, and that of a row with an ordering key none. A connector classifies a failure (see package
// connectors): permanent goes to dead at once; anything else is retried at
// now + backoff (exponential from Config.BackoffBase, ±20% jitter, capped at
// Config.BackoffMax), or at the receiver's Retry-After when it named a wait (0 or a
// date already past names none), until Config.MaxAttempts or Config.MaxAge sends the
// row to dead. last_error says what happened in a sentence.
//
// # Ambiguous attempts
//
// An attempt is ambiguous when the relay cannot know whether the receiver acted: the
// connection broke after the request was written, or the relay died and its lease
// expired (another relay then puts the row back, or sends it to dead when that was its
// last attempt or another now would pass its maximum age, and logs the abandoned attempt
// as ambiguous). What follows depends on the connector's guarantee: enforced connectors
// retry (the receiver dedupes on the key); reconciled connectors are told the previous
// attempt was ambiguous and look for the effect before acting; forwarded connectors retry,
// or, with the hold policy, leave the row held for an operator (an ambiguous attempt
// its connector also calls permanent included: held, not dead). The row's ambiguous
// column tells of its latest attempt only, which a plain failure clears; a row that then
// goes dead names the earlier ambiguous attempt in last_error, since the receiver may
// have acted on it.
//
// Rows for connectors the relay does not have stay pending and, while no other running
// relay has them either, are reported in the log and the outboxd_unknown_connector_rows
// metric: never dead, never lost.
//
// # Stopping and failures
//
// When Run's context ends, the relay stops claiming, hands back at once the rows it had
// claimed but not started (with a NOTIFY, so that the relays still running take them at
// once), lets deliveries in flight finish within
// Config.ShutdownTimeout, cancels the rest (recorded as ambiguous retries; an attempt
// its connector reports as cancelled before anything was sent is handed back
// uncounted, and a receiver's answer that came as the cancel struck is decided as any
// other), and records every outcome (with a NOTIFY when one lets the next row of an
// ordering key go, which is then for the relays still running). Database errors are
// retried with backoff, so the relay rides out a PostgreSQL restart: outcomes wait in
// memory until they can be written, and rows whose outcome never lands are retried after
// their lease expires. A receiver's answer is made storable before it is written (NUL
// and bytes that are not UTF-8 become U+FFFD); should PostgreSQL still refuse a batch of
// outcomes for their data, the batch is written in halves, split again down to the
// outcome refused alone, which is recorded without the answer, the reason added to
// last_error: one odd answer never stops a relay. Nor does one odd row: a row the claim
// cannot take for its data (which only plain SQL writes: an attempts count at the integer
// maximum, numbers written out past PostgreSQL's 1 GB limit on text) goes to dead
// unsent, its last_error saying why, and the claims and outcomes go on.
package relay
