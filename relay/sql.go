package relay

import (
	"strings"

	"github.com/outboxd/outboxd/internal/finished"
	"github.com/outboxd/outboxd/outbox"
)

// claimSQL takes up to $3 due rows of connector $1 and leases them to relay $4 until $5,
// in one statement: the CTE locks candidates with SKIP LOCKED, so relays sharing the table
// never take the same row, and the UPDATE marks them delivering and counts the attempt.
// A row with an ordering key is due only when no earlier row of its key is unfinished, so
// each key delivers one row at a time, in id order. Nor is it due while any row of its
// key is in flight, a later one included: a row that finished (dead, delivered) and went
// back to pending (a replay, a late outcome) must not be sent alongside the row of its key
// that went on meanwhile. (Only later rows are looked up there, by outbox_ordering_delivering:
// earlier ones are in the first test, and a lookup by key alone was planned as a hash
// of every row in flight, dead index entries included.) $2 is the relay's clock; a row is
// due by it or by the database's clock, whichever is later: the relay's correction to the
// database's clock is off by up to half a round trip either way, and a relay a
// millisecond behind would take a row stamped now() by its insert, whose NOTIFY woke it,
// for one not yet due, and leave it for the next poll.
//
// The scan starts at next_attempt_at $6 ('-infinity' for the whole index): the head of
// outbox_pending_due holds the entries of rows claimed since the last vacuum, dead but
// still in the index, and a claim that walked them all every time would grow slower with
// every row delivered (see Relay.claimRound).
//
// The claim stops at $7 bytes: it takes rows in order while the ones before them add up
// to less (so always the first), and leaves the others locked until it commits (see
// Config.MaxClaimedBytes). A row counts at the length of its payload's and headers' text,
// which is what the relay holds, when they are stored compressed or take more than 1 kB:
// their stored size can be far less (a 100 kB payload compressed to 1 kB, characters
// escaped as \u0001 in text). A small value counts at its stored size: turning every row
// into text cost some 5 µs of PostgreSQL's CPU per row delivered (alternating runs of
// outboxd bench), and a small value's text is at most six times its stored size, but for
// numbers written out in full (1e5000 stored in a few bytes), which only plain SQL or a
// crafted request writes. Only the length is kept here: were the text kept, every
// candidate's (up to $3, however few the bound lets through) would be stored in the CTE
// and sorted, and a batch of 8 kB payloads spilled to temporary files on every claim.
// pg_column_compression needs PostgreSQL 14.
//
// The update finds each row by the ctid of the version the claim locked, which no one
// else can change before it commits: one page read a row, where a lookup by id read
// three (the primary key's index), or read the whole table (a hash join, which the
// planner took for small tables). A row whose locked version is newer than the
// statement's snapshot (another transaction changed it after the snapshot and before
// the lock; EvalPlanQual still found it due) is not visible to the update's scan: it is
// locked but not claimed, and the next round takes it. BenchmarkClaimAndRecord, seven
// alternating pairs: PostgreSQL about 1 µs less a row (33.2–38.6 µs against 34.0–43.0).
//
// EXPLAIN (10,000 pending rows, PostgreSQL 15):
//
//	Update on outbox o
//	  CTE due
//	    ->  Limit
//	          ->  LockRows
//	                ->  Index Scan using outbox_pending_due on outbox o_1
//	                      Index Cond: ((connector = $1) AND (next_attempt_at >= $6) AND (next_attempt_at <= GREATEST($2, now())))
//	                      Filter: ((ordering_key IS NULL) OR ((NOT (SubPlan 1)) AND (NOT (SubPlan 2))))
//	                      SubPlan 1
//	                        ->  Index Only Scan using outbox_ordering_unfinished on outbox p
//	                              Index Cond: ((ordering_key = o_1.ordering_key) AND (id < o_1.id))
//	                      SubPlan 2
//	                        ->  Index Only Scan using outbox_ordering_delivering on outbox d
//	                              Index Cond: ((ordering_key = o_1.ordering_key) AND (id > o_1.id))
//	  ->  Nested Loop
//	        ->  Subquery Scan on fits
//	              Filter: (fits.before < $7)
//	              ->  WindowAgg
//	                    ->  Sort
//	                          Sort Key: due.next_attempt_at, due.id
//	                          ->  CTE Scan on due
//	        ->  Tid Scan on outbox o
//	              TID Cond: (ctid = fits.tid)
const claimSQL = `
WITH due AS (
    SELECT o.ctid AS tid, o.id, o.next_attempt_at,
           CASE WHEN pg_column_size(o.payload) <= 1024 AND pg_column_compression(o.payload) IS NULL
                THEN pg_column_size(o.payload) ELSE octet_length(o.payload::text) END
           + CASE WHEN pg_column_size(o.headers) <= 1024 AND pg_column_compression(o.headers) IS NULL
                  THEN pg_column_size(o.headers) ELSE octet_length(o.headers::text) END AS size,
           -- Parked behind its key's earlier row (parkSQL, parkWaitingSQL): next_attempt_at
           -- is that row's retry, or the end of a minute's parking behind a row that waits
           -- for an operator, not the row's own schedule (see claimed.committedFor).
           o.attempts = 0 AND coalesce(starts_with(o.last_error, '` + outbox.ParkedPrefix + `'), false) AS parked
    FROM outbox o
    WHERE ` + claimDue + `
), fits AS (
    SELECT tid, parked, sum(size) OVER (ORDER BY next_attempt_at, id ROWS UNBOUNDED PRECEDING) - size AS before
    FROM due
)
UPDATE outbox o
SET status = 'delivering', lease_owner = $4, lease_expires_at = $5,
    attempts = o.attempts + 1, updated_at = $2, first_attempt_at = coalesce(o.first_attempt_at, $2),
    -- A row parked behind its key's earlier row (parkSQL, parkWaitingSQL) no longer waits.
    last_error = CASE WHEN fits.parked THEN NULL ELSE o.last_error END
FROM fits
WHERE o.ctid = fits.tid AND fits.before < $7
RETURNING o.id, o.idempotency_key, o.payload, o.headers, o.attempts, o.ambiguous, o.created_at,
          o.first_attempt_at, o.ordering_key IS NOT NULL, o.next_attempt_at, fits.parked`

// claimDue is the part of claimSQL that finds and locks its rows (outbox o): up to $3
// due rows of connector $1 by $2, the scan starting at $6, as claimSQL says. Its
// conditions are joined by AND at the top, so another may go before them.
const claimDue = `o.status = 'pending'
      AND o.connector = $1
      AND o.next_attempt_at <= greatest($2, now())
      AND o.next_attempt_at >= $6
      AND (o.ordering_key IS NULL OR (NOT EXISTS (
            SELECT 1 FROM outbox p
            WHERE p.ordering_key = o.ordering_key AND p.id < o.id
              AND p.status IN ('pending', 'delivering', 'held', 'awaiting_approval'))
          AND NOT EXISTS (
            SELECT 1 FROM outbox d
            WHERE d.ordering_key = o.ordering_key AND d.id > o.id AND d.status = 'delivering')))
    ORDER BY o.next_attempt_at, o.id
    LIMIT $3
    FOR UPDATE SKIP LOCKED`

// unclaimableDueSQL locks the rows claimSQL would take (its arguments $1 to $3, and $6
// as $4), for Relay.buryUnclaimable to find among them those it cannot claim. It is the
// first statement of its transaction, and bounds how long the transaction may idle
// (idleGate).
var unclaimableDueSQL = `SELECT o.id FROM outbox o WHERE ` + idleGate + ` AND ` + strings.ReplaceAll(claimDue, "$6", "$4")

// claimProbeSQL computes, for rows $1, what claimSQL computes of every row it takes and
// might fail at for the row's data: its payload's and headers' text (which PostgreSQL
// cannot make past 1 GB: numbers written out in full, 1e131071 stored in a few bytes,
// which only plain SQL writes) and its next attempt's number (an attempts count at the
// integer maximum).
const claimProbeSQL = `SELECT octet_length(payload::text)::bigint + octet_length(headers::text) + (attempts + 1)
FROM outbox WHERE id = ANY($1)`

// buryUnclaimableSQL sends row $1, which claimSQL cannot take, to dead with reason $2,
// at the relay's clock $3, and returns its key.
const buryUnclaimableSQL = `UPDATE outbox SET status = 'dead', last_error = $2, updated_at = $3
WHERE id = $1 AND status = 'pending'
RETURNING idempotency_key`

// recordSQL writes many outcomes in one round trip: it updates each row still leased to
// this relay ($1) for the same attempt, and logs every attempt. A row whose lease expired
// and was put back (pending or held, marked ambiguous; dead when that was its last
// attempt) but not yet taken again accepts a late delivery: the attempt did finish, the
// receiver acted, and that is the truth whatever happened to the row since. Any other
// late answer is left in the attempts log only: for a row put back to pending it is no
// more than the next attempt will learn; a held row waits for an operator, who sees it
// there; and it would undo what an operator did meanwhile (a replay, with a new key or
// not: held or dead again and never sent, or the held original sent beside its copy). A
// row put away as dead accepts a final answer (delivered, dead): a late retry or hold
// would bring back a row that reclaim gave up on (its maximum age passed), and with an
// ordering key, after its key went on. A row an operator canceled after its lease
// expired (still ambiguous) accepts only a delivery. None of this reads outbox_audit,
// which the relay's role need not be able to. Its first step bounds its lock waits and
// those of the statements after it ($12, see recordLockWaitGate).
const recordSQL = `
WITH r AS (
    SELECT *
    FROM ` + recordUnnest + `
    WHERE ` + recordLockWaitGate + `
), ` + recordWrite

// recordAgainSQL is recordSQL for outcomes that may already have been written: the
// transaction that wrote them may have committed without its reply reaching the relay
// (the connection broke). An outcome whose attempt this relay already logged, with the
// same outcome and end, is left out, so the attempt is logged once and its row is not
// written again. Only batches written again after such a failure use it; its lookup
// reads outbox_attempts_outbox_id.
const recordAgainSQL = `
WITH r AS (
    SELECT *
    FROM ` + recordUnnest + `
    WHERE NOT EXISTS (
        SELECT 1 FROM outbox_attempts a
        WHERE a.outbox_id = t.id AND a.attempt = t.attempt AND a.relay_id = $1
          AND a.outcome = t.outcome AND a.finished_at = t.finished_at)
      AND ` + recordLockWaitGate + `
), ` + recordWrite

// lockAgainSQL locks the rows $1 of outcomes about to be written with recordAgainSQL,
// in the same transaction: a write of them still running in the database holds their
// locks until it ends, and recordAgainSQL, which starts after, sees what it logged.
// Looked for in the statement that waited for the locks, the attempts that write logged
// were not seen (the statement's snapshot is older than their commit), and they were
// logged twice. Its first step bounds its lock waits and those of recordAgainSQL after
// it ($2, as recordLockWaitGate's $12).
const lockAgainSQL = `SELECT 1 FROM outbox
WHERE id = ANY($1::bigint[]) AND (SELECT set_config('lock_timeout', $2::text, true)) IS NOT NULL
ORDER BY id FOR NO KEY UPDATE`

// recordLockWaitGate is recordLockWaitSQL as a condition of recordSQL (and
// recordAgainSQL), $12 the milliseconds: a write of outcomes then sends one statement,
// not two, in every round. An uncorrelated subquery, it runs once, before the statement
// reads its first outcome, and so before it waits for any row's lock; the statement's
// table locks are taken before, as it is planned or bound, and a lock on the table
// (a migration's CREATE INDEX holds SHARE on outbox while it scans it; LOCK TABLE) is
// waited for as the claims wait for it, up to roundTimeout, not cut at a second: no
// look at row locks can tell the relay which outcome it holds up, since it holds up all
// of them (see Relay.writeAround).
const recordLockWaitGate = `(SELECT set_config('lock_timeout', $12::text, true)) IS NOT NULL`

// recordLockWaitSQL bounds, for the rest of its transaction, how long each statement
// waits for a lock (lock_timeout, $1 milliseconds), and fails it then (SQLSTATE 55P03):
// the first step of a write of outcomes (see queueRecord), which recordSQL and
// lockAgainSQL take in a condition of their own (see lockWaitGate). A row whose lock another
// session keeps (a psql BEGIN; SELECT ... FOR UPDATE left open, an application's
// transaction) stalled the write of every outcome beside it and the claims that ride
// with them, round after round; failed, the relay writes the others without it (see
// Relay.writeAround). Local to the transaction (set_config's true), so that it never
// outlives the write in a session of a pool an application shares; it holds for every
// statement after it in the batch, which runs as one transaction in each query exec
// mode (one Sync in the extended protocol, one query string in the simple one).
const recordLockWaitSQL = `SELECT set_config('lock_timeout', $1::text, true)`

// lockedOutcomesSQL finds, without waiting, which of the outcomes $1 (their rows' ids)
// would wait for a lock another session holds: on its row, or for those of them that end
// a row of an ordering key ($2, the outcomes lockNextSQL runs for), on the key's next
// row not finished. It returns each such outcome's row and the row locked. The lock
// taken to look is the one the write takes (FOR NO KEY UPDATE: recordSQL's update,
// lockAgainSQL, lockNextSQL), so a replay's FOR KEY SHARE, which does not hold up the
// write, is not taken for a lock that does; it is let go as the statement ends. The next
// row is looked up as nextUnfinished does (nextOfKey), but before the outcome is
// written, so its row is still in flight. A row that is gone is no lock.
const lockedOutcomesSQL = `
WITH t AS (
    SELECT o.id, o.id AS locked FROM unnest($1::bigint[]) AS o(id)
    UNION ALL
    SELECT h.id, ` + nextOfKey + `
    FROM outbox h
    WHERE h.id = ANY($2::bigint[])
), free AS (
    SELECT id FROM outbox WHERE id IN (SELECT locked FROM t) FOR NO KEY UPDATE SKIP LOCKED
)
SELECT t.id, t.locked FROM t
WHERE t.locked NOT IN (SELECT id FROM free)
  AND EXISTS (SELECT 1 FROM outbox x WHERE x.id = t.locked)`

// recordUnnest is the outcomes of recordSQL's arguments, one row each, as t.
const recordUnnest = `unnest($2::bigint[], $3::int[], $4::text[], $5::timestamptz[], $6::text[], $7::jsonb[],
                $8::bool[], $9::timestamptz[], $10::timestamptz[], $11::text[])
         AS t(id, attempt, status, next_attempt_at, last_error, result, ambiguous, started_at, finished_at, outcome)`

// recordWrite is what recordSQL does with the outcomes r.
const recordWrite = `upd AS (
    UPDATE outbox o
    SET status = r.status,
        next_attempt_at = coalesce(r.next_attempt_at, o.next_attempt_at),
        -- The row's ambiguous mark tells of this attempt only: a row that goes dead on a
        -- plain failure after an ambiguous attempt says so here, or the API, MCP and list,
        -- which show last_error, would show a row the receiver never acted on. The
        -- attempts log keeps each attempt's own error.
        last_error = CASE WHEN r.status = 'dead' AND NOT r.ambiguous
                          THEN coalesce(r.last_error, o.last_error) || coalesce('; but attempt ' || (
                                   SELECT max(a.attempt) FROM outbox_attempts a
                                   WHERE a.outbox_id = o.id AND a.attempt < r.attempt AND a.ambiguous)
                               || ' was ambiguous: the receiver may have acted then, so check it before sending the row again', '')
                          ELSE coalesce(r.last_error, o.last_error) END,
        -- A delivery's answer is its own, or none: an earlier failed attempt's answer
        -- would read as the receiver's answer to the delivery.
        result = CASE WHEN r.status = 'delivered' THEN r.result ELSE coalesce(r.result, o.result) END,
        ambiguous = r.ambiguous,
        lease_owner = NULL,
        lease_expires_at = NULL,
        delivered_at = CASE WHEN r.status = 'delivered' THEN r.finished_at ELSE o.delivered_at END,
        updated_at = r.finished_at
    FROM r
    WHERE o.id = r.id
      AND o.attempts = r.attempt
      AND ((o.status = 'delivering' AND o.lease_owner = $1)
           OR (o.status IN ('pending', 'held') AND o.ambiguous AND r.status = 'delivered')
           OR (o.status = 'dead' AND o.ambiguous AND r.status IN ('delivered', 'dead'))
           OR (o.status = 'canceled' AND o.ambiguous AND r.status = 'delivered'))
    RETURNING o.id
)
INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
SELECT r.id, r.attempt, $1, r.started_at, r.finished_at, r.outcome, r.ambiguous, r.last_error
FROM r`

// parkSQL parks the rows waiting behind rows $1, rows of ordering keys whose attempt
// failed and that went back to pending for a retry after $2 (the relay's clock): a row
// behind one of them cannot go before that retry, and every claim until then would read
// it again from outbox_pending_due and look up its key's earlier rows, about 15–25 µs a
// row here, so a key with thousands of rows behind a failing head slowed every claim of
// its connector. A parked row takes the retry's time as its next_attempt_at, and $3 (the
// head's, in the order of $1; outbox.WaitingBehind) as its last_error, which says why it
// waits and marks it as parked. Only rows never attempted and due by $2 are parked: their
// own schedule has passed, so canceling the head can make them due at once (ops.Cancel),
// and a row scheduled for later keeps its time. Rows parked already (behind the head
// while it was in flight, parkWaitingSQL) take the retry's time too, whatever time they
// had: a minute's parking that ends before a later retry would have every claim read
// them again until it. A parked row is due again when the head's retry is, and parked
// anew if that fails too. Rows another transaction holds are left as they are.
const parkSQL = `
WITH p AS (
    SELECT f.id, h.next_attempt_at AS until, w.why
    FROM unnest($1::bigint[], $3::text[]) AS w(id, why)
    JOIN outbox h ON h.id = w.id
    JOIN outbox f ON f.ordering_key = h.ordering_key AND f.id > h.id
    WHERE h.status = 'pending' AND h.next_attempt_at > $2
      AND f.status = 'pending' AND f.attempts = 0
      AND ((f.last_error IS NULL AND f.next_attempt_at <= $2)
           OR starts_with(f.last_error, '` + outbox.ParkedPrefix + `'))
    FOR UPDATE OF f SKIP LOCKED
)
UPDATE outbox f
SET next_attempt_at = p.until, last_error = p.why, updated_at = $2
FROM p
WHERE f.id = p.id`

// waitingHeadsSQL finds rows of ordering keys that are held or await approval, which
// only an operator ends (outbox_needs_attention), up to $1, for parkWaitingSQL: their
// ids and their keys, which the rows parked behind them name.
const waitingHeadsSQL = `
SELECT id, idempotency_key FROM outbox
WHERE status IN ('held', 'awaiting_approval') AND ordering_key IS NOT NULL
ORDER BY status, created_at DESC, id DESC
LIMIT $1`

// inFlightHeadsSQL finds the rows of ordering keys this relay ($1) is delivering, up to
// $2, for parkWaitingSQL, as waitingHeadsSQL does: a key's rows go out one at a time,
// so while one is in flight every claim would read the rows behind it again and look up
// their key's earlier rows, about 15–25 µs a row here, and a key with a backlog of N
// rows took N claims, each reading what was left of it: 22.6 ms a row with 2,000 rows,
// 10.5 with 1,000 (BenchmarkOneKeyBacklog), 2.6–3.1 ms parked. Each relay parks
// behind its own rows, and only behind those with more than $3 rows of their key not
// finished behind them (parkBehindMin): a row that waits behind a few is read by the
// claims that do not find enough rows before it, which costs less than writing it
// twice.
const inFlightHeadsSQL = `
SELECT h.id, h.idempotency_key FROM outbox h
WHERE h.status = 'delivering' AND h.ordering_key IS NOT NULL AND h.lease_owner = $1
  AND EXISTS (
      SELECT 1 FROM outbox f
      WHERE f.ordering_key = h.ordering_key AND f.id > h.id
        AND f.status IN ('pending', 'delivering', 'held', 'awaiting_approval')
      OFFSET $3)
ORDER BY h.id
LIMIT $2`

// waitingFollowers is the rows parkWaitingSQL parks behind rows w (see there), as f,
// while those rows' status is one of $4.
const waitingFollowers = `
    JOIN outbox h ON h.id = w.id
    JOIN outbox f ON f.ordering_key = h.ordering_key AND f.id > h.id
    WHERE h.status = ANY($4::text[])
      AND f.status = 'pending' AND f.attempts = 0
      AND ((f.last_error IS NULL AND f.next_attempt_at <= $2)
           OR (starts_with(f.last_error, '` + outbox.ParkedPrefix + `') AND f.next_attempt_at <= $3))`

// lockWaitingSQL locks, for parkWaitingSQL in the same transaction, the rows it may
// park behind rows $1 (by the relay's clock $2 and its next pass $3, while rows $1 have
// a status of $4), and returns them. The statement that parks them checks their rows
// still wait only once it holds them:
// an operator's decision on such a row that committed while one statement read it as
// waiting and then reached the rows behind it (released by the decision, or never
// parked) left them parked behind a row that no longer waits, for a minute. Locked
// first, a row parked already is released by a decision that commits after the parking
// (package ops, unpark, waits for it), and a decision that committed before the parking
// began is seen by it. A row not parked yet is not covered: unpark, which does not see
// it parked, does not wait for it, so a decision that commits while parkWaitingSQL runs
// leaves it parked for up to parkFor. That is the first pass behind a row only; later
// passes renew rows parked already. It is the first statement of its transaction, and
// bounds how long the transaction may idle (idleGate).
const lockWaitingSQL = `
SELECT f.id
FROM unnest($1::bigint[]) AS w(id)` + waitingFollowers + `
  AND ` + idleGate + `
FOR UPDATE OF f SKIP LOCKED`

// idleGate has the server end the session of a transaction of the relay that sends more
// than one statement (reclaimSQL's, lockWaitingSQL's) should the relay leave it idle for
// five seconds between them: its process paused (SIGSTOP, docker pause, a VM stunned),
// or the network gone. Otherwise the rows it locked stayed locked for as long as the
// pause lasted, or, for a network gone without a reset, until the server's TCP
// keepalive gave up on the session, hours with the defaults (the relay's own time limit,
// maintainTimeout, ends only its side of the connection): the rows of a dead relay that
// its reclaim had taken were put back by no relay, and the rows it had locked to park
// them were claimed by none, nor was the outcome of the row before them written
// (lockNextSQL waits for them), by any relay. A relay sends a transaction's statements
// one after the other, and never idles that long otherwise. As the operators' commands
// bound theirs (internal/ops, idleLimitSQL). A condition, not a statement of its own:
// an uncorrelated subquery, it runs once, before the statement locks any row, and is
// local to the transaction (set_config's true).
const idleGate = `(SELECT set_config('idle_in_transaction_session_timeout', '5s', true)) IS NOT NULL`

// parkWaitingSQL parks the rows waiting behind rows $1, rows of ordering keys whose
// status is one of $4 (held or awaiting approval; or in flight), until $6, with $5
// (outbox.WaitingForOperator or outbox.WaitingForDelivery, in the order of $1) as their
// last_error, as parkSQL does behind a failed row, for the same reason: every claim
// would read them again while the row waits. Since that has no time, a parked row is due
// again at $6 (the relay's clock $2 and a minute, or two of its passes), and parked
// anew by the next pass that finds its row still waiting, if its time runs out before
// $3 (the next pass). Rows never attempted and due by $2, or parked already, are
// parked; a row scheduled for later keeps its time until then. Only rows $7, which
// lockWaitingSQL locked in the same transaction, are parked. An operator's decision on
// row $1 makes them due at once (package ops, unpark), and so does its outcome, or a
// decision on the key's next row (releaseNextSQL). A pass that read a row as waiting,
// in flight say, may park the row behind it after its outcome committed, having found
// nothing parked to release: that outcome first waited for the pass to let go of the
// row (lockNextSQL), and then sees it parked. The pass's statements skip what they find
// locked, so it never waits: it cannot deadlock, and never holds up the rows it parks
// behind (a lock on them, FOR SHARE, had a pass behind rows in flight skip nearly every
// row, each held by its relay's round for most of its time in flight).
const parkWaitingSQL = `
WITH p AS (
    SELECT f.id, w.why
    FROM unnest($1::bigint[], $5::text[]) AS w(id, why)` + waitingFollowers + `
      AND f.id = ANY($7::bigint[])
    FOR UPDATE OF f SKIP LOCKED
)
UPDATE outbox f
SET next_attempt_at = $6, last_error = p.why, updated_at = $2
FROM p
WHERE f.id = p.id`

// releaseNextSQL makes due the next row of the ordering key of each row $1, rows whose
// outcome (delivered or dead) this transaction wrote, or that reclaimSQL put back (one
// put back to pending or held is not finished, so nothing behind it goes), when that
// row is parked (parkWaitingSQL, behind a row in flight or one waiting for an operator;
// parkSQL): the row after it is the one to go next, and a parked row is due from its
// creation, as ops.unpark makes them. The rest stay parked, each released in its turn,
// so a key's backlog is written twice (parked, released), not read by every claim. The
// next row is found whichever row its text names. lockNextSQL, in the same
// transaction, waited for a parking pass or an operator's decision that held that row,
// and this statement sees what they did.
const releaseNextSQL = `
UPDATE outbox f
SET next_attempt_at = least(f.created_at, $2), last_error = NULL, updated_at = $2
WHERE f.id = ANY (ARRAY(` + nextUnfinished + `))
  AND f.status = 'pending' AND f.attempts = 0
  AND starts_with(f.last_error, '` + outbox.ParkedPrefix + `')`

// nextUnfinished is the row not finished that comes next in the ordering key of each
// row $1 that is finished, for lockNextSQL and releaseNextSQL. Its lookup starts at the
// row, not at the head of its key, whose entries in outbox_ordering_unfinished left by
// the key's finished rows it would read through one by one, with the heap tuples
// behind them; and the statements take the rows as an array, so that they read the
// table by index (written as joins, they were planned as hash joins over the whole
// table). Both cost 2,000 keys of 10 rows a third more time per row delivered
// (BenchmarkManyKeysBacklog). A row not finished before the row (replayed since) is not
// looked for: a row made due behind it is held back by the claim's own check.
const nextUnfinished = `
    SELECT ` + nextOfKey + `
    FROM outbox h
    WHERE h.id = ANY($1::bigint[])
      AND h.status NOT IN ('pending', 'delivering', 'held', 'awaiting_approval')`

// nextOfKey is the id of the row not finished that comes next, after row h, in h's
// ordering key (NULL when none does).
const nextOfKey = `(SELECT u.id FROM outbox u
            WHERE u.ordering_key = h.ordering_key AND u.id > h.id
              AND u.status IN ('pending', 'delivering', 'held', 'awaiting_approval')
            ORDER BY u.id
            LIMIT 1)`

// lockNextSQL locks, for releaseNextSQL in the same transaction, the next row not
// finished of the ordering key of each row $1, waiting for a transaction that holds it.
// A parking pass may be parking it (see parkWaitingSQL); an operator may be canceling or
// rejecting it, and then the row after it is the key's next: that decision's snapshot
// did not see this outcome, so it left that row parked (package ops, unpark), and
// releaseNextSQL, looking in a snapshot taken before the decision committed, would find
// the row it ended and release nothing, leaving the key's next row parked for up to a
// minute behind nothing. Once it has the row, releaseNextSQL, a statement of its own,
// sees what they did. The rows are locked in id order, as a replay locks the rows behind
// the rows it replays (package ops, unparkLockSQL): in the order of $1, an outcome of
// two keys and a replay of a row of each locked them in opposite orders and deadlocked.
// The lock is the one releaseNextSQL's update takes: FOR UPDATE would also wait for a
// replay's FOR KEY SHARE (ops, waitLaterClaimsSQL), which may in turn wait for a row
// this transaction holds.
//
// A next row that is pending and of an instance other than $2, the instances this relay
// claims itself (none once it was asked to stop), wakes the relays (NOTIFY, sent at
// commit): ordering keys are one namespace for every connector, and relays sharing a
// database may have different instances. This relay's own claims look for the keys'
// next rows (see Relay.claimRound), but a relay with that row's instance heard nothing
// and found it only at its poll interval. (Here, where each next row is found anyway,
// not in a statement of its own, which would look every one up again; pg_notify
// returns void, cast to text to be read.)
const lockNextSQL = `
SELECT n.id, CASE WHEN n.status = 'pending' AND n.connector <> ALL($2::text[])
                  THEN pg_notify('` + notifyChannel + `', '')::text END
FROM outbox n
WHERE n.id = ANY (ARRAY(` + nextUnfinished + `))
ORDER BY n.id
FOR NO KEY UPDATE OF n`

// wakeEarlierSQL wakes the relays (NOTIFY, sent at commit) when a row of $1, rows of
// ordering keys whose outcome this transaction wrote (no longer in flight: delivered,
// dead, back to pending or held), has an earlier row of its key pending, of an instance
// other than $2 (the instances this relay claims itself, see lockNextSQL). Such a row was
// replayed while the later one was in flight, and waited for it (claimSQL: no later row
// of its key delivering); it may be due now, and a relay with its instance, which the
// replay's NOTIFY woke while it still waited, heard nothing more and found it only at
// its poll interval. lockNextSQL looks only for the rows after each row.
const wakeEarlierSQL = `
SELECT pg_notify('` + notifyChannel + `', '')
WHERE EXISTS (
    SELECT 1 FROM outbox h JOIN outbox e ON e.ordering_key = h.ordering_key AND e.id < h.id
    WHERE h.id = ANY($1::bigint[]) AND h.status <> 'delivering'
      AND e.status = 'pending' AND e.connector <> ALL($2::text[]))`

// releaseSQL hands back rows this relay ($1) claimed but never started, $2 with the
// attempts $5 they were claimed for and their claims' leases $6: they return to pending
// and the attempt that never began is uncounted. A row claimed again since (its lease
// ran out, and this relay or another took it anew; or an earlier release committed
// without its reply, and this relay took it anew for the same attempt) has another
// lease and is left alone. When $4 (the relay was asked to stop) it wakes the relays
// still running, and it returns the rows it found locked (see handBackTail).
const releaseSQL = `
WITH mine AS (
    SELECT o.id, o.idempotency_key, o.attempts, o.lease_expires_at
    FROM outbox o
    JOIN unnest($2::bigint[], $5::int[], $6::timestamptz[]) AS r(id, attempt, lease) ON o.id = r.id
    WHERE o.attempts = r.attempt AND o.status = 'delivering' AND o.lease_owner = $1
      AND o.lease_expires_at = r.lease` + handBackTail

// handBackTail ends a hand-back (releaseSQL, releaseLostSQL) of the rows mine, this
// relay's ($1) rows as its snapshot sees them (id, idempotency_key, attempts,
// lease_expires_at), $3 being the relay's clock. It hands back only the rows it can lock
// without waiting (SKIP LOCKED), checked again once locked, in case another session
// changed them since the snapshot: a row lock another session keeps (a psql BEGIN; SELECT ... FOR
// UPDATE left open, an application's transaction) held the hand-back up for its ten
// seconds, and, tried again before every round, the claim loop with it, for as long as
// the lock was kept. The lock is the one the update takes (FOR NO KEY UPDATE), so a
// replay's FOR KEY SHARE, which would not hold the update up, is not skipped.
//
// It returns one row: how many rows it handed back; when $4 and it handed back any, a
// NOTIFY to the relays (sent at commit, as an insert's: a relay asked to stop claims no
// more rows, and they are for the relays still running, whose claims then start at the
// head of the index, where these rows lie; pg_notify returns void, cast to text to be
// read); and the rows it skipped, locked, as arrays of their ids, keys, attempts and
// leases, in id order, to be handed back later (see Relay.setAsideRelease). A row
// another session changed meanwhile (one that locked it to end it) may be among them:
// the next try finds it no longer this relay's, and forgets it.
const handBackTail = `
), free AS (
    SELECT o.id FROM outbox o JOIN mine m ON o.id = m.id
    WHERE o.attempts = m.attempts AND o.status = 'delivering' AND o.lease_owner = $1
      AND o.lease_expires_at = m.lease_expires_at
    FOR NO KEY UPDATE OF o SKIP LOCKED
), released AS (
    UPDATE outbox o
    ` + releaseSet + `FROM free f
    WHERE o.id = f.id
    RETURNING 1
), locked AS (
    SELECT * FROM mine WHERE id NOT IN (SELECT id FROM free)
)
SELECT (SELECT count(*) FROM released),
       CASE WHEN $4::bool AND EXISTS (SELECT 1 FROM released) THEN pg_notify('` + notifyChannel + `', '')::text END,
       ARRAY(SELECT id FROM locked ORDER BY id),
       ARRAY(SELECT idempotency_key FROM locked ORDER BY id),
       ARRAY(SELECT attempts FROM locked ORDER BY id),
       ARRAY(SELECT lease_expires_at FROM locked ORDER BY id)`

// reclaimSQL puts back rows of this relay's connectors ($4) whose lease expired (their
// relay died or lost the database): the abandoned attempt is logged as ambiguous, and the
// row becomes pending again; held for an operator when its connector is forwarded with the
// hold policy ($3), whatever its attempts and age, as decide rules for an ambiguous
// attempt (dead would let the next row of its ordering key go without the operator);
// else dead when it has used its attempts ($2) or when the next attempt, now, would come
// later than its connector's maximum age ($5, seconds, in the order of $4) after its
// first attempt, as decide rules for a retry. $1 is the relay's clock.
// Rows $7 of this relay ($6) are left alone: their attempts ended, and this relay holds
// their outcomes, not written yet (see Relay.noteUnwritten), or they never started, and
// this relay hands them back once another session lets go of its lock on them (see
// Relay.setAsideRelease).
// Only relays that have the connector decide, since only they know its policy. It
// returns the rows it took, in id order, each with its key and its new status (pending,
// held or dead: the log tells them apart and names some of them), for releaseNextSQL: a
// row of an ordering key sent to dead lets its key's next row go, which a relay may have
// parked behind it while it was in flight. It is the first statement of its transaction,
// and bounds how long the transaction may idle (idleGate).
const reclaimSQL = `
WITH expired AS (
    SELECT id, lease_owner, updated_at AS started_at, attempts,
           coalesce(first_attempt_at, created_at) + make_interval(secs => ($5::float8[])[array_position($4::text[], connector)]) < $1 AS too_old
    FROM outbox
    WHERE status = 'delivering' AND lease_expires_at < $1 AND connector = ANY($4)
      AND NOT (lease_owner = $6 AND id = ANY($7::bigint[]))
      AND ` + idleGate + `
    ORDER BY lease_expires_at
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE outbox o
    SET status = CASE WHEN o.connector = ANY($3) THEN 'held'
                      WHEN o.attempts >= $2 OR e.too_old THEN 'dead'
                      ELSE 'pending' END,
        ambiguous = true,
        last_error = 'relay ' || e.lease_owner || ' lost its lease during attempt ' || e.attempts
                     || ' (it stopped or lost the database), so the receiver may or may not have acted'
                     || CASE WHEN o.connector = ANY($3) THEN '; held for an operator to replay or cancel'
                             WHEN o.attempts >= $2 THEN '; that was the last allowed attempt'
                             WHEN e.too_old THEN '; gave up: another attempt now would be later than the maximum age'
                             ELSE '' END,
        lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = $1, updated_at = $1
    FROM expired e
    WHERE o.id = e.id
    RETURNING o.id, o.idempotency_key, o.status::text
), logged AS (
    INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
    SELECT e.id, e.attempts, e.lease_owner, e.started_at, $1, 'lease_expired', true,
           'lease expired before the outcome was recorded'
    FROM expired e
)
SELECT id, idempotency_key, status FROM upd ORDER BY id`

// releaseSet is how a release puts a row back: pending, unleased, and the attempt it was
// claimed for uncounted ($3 is the relay's clock).
const releaseSet = `SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL,
    attempts = o.attempts - 1, updated_at = $3,
    first_attempt_at = CASE WHEN o.attempts = 1 THEN NULL ELSE o.first_attempt_at END
`

// fenceSQL ends the backends of sessions $1 (process ids) started at $2, if they still
// run as this role, waiting up to $3 milliseconds for each to exit, and reports whether
// all did (see Relay.fence).
const fenceSQL = `
SELECT coalesce(bool_and(pg_terminate_backend(a.pid, $3)), true)
FROM pg_stat_activity a
JOIN unnest($1::int[], $2::timestamptz[]) AS s(pid, start) ON a.pid = s.pid AND a.backend_start = s.start
WHERE a.usename = current_user AND a.pid <> pg_backend_pid()`

// sessionSQL reads the session's backend process id and start (see sessionOf). The
// start is NULL when the current role lacks the privileges of the role the session
// logged in as, as after SET ROLE (options=-c role=…, or ALTER ROLE … SET role):
// pg_stat_activity hides it then, even for the session itself.
const sessionSQL = `SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`

// releaseLostSQL hands back the rows this relay ($1) claimed in rounds whose reply it
// never got (the connection broke around the commit), found by their lease's expiry,
// which is unique to each round of a relay ($2): they return to pending as releaseSQL
// does, since no worker ever saw them. A row whose lease has expired and was put back,
// or claimed again since, no longer matches. $3 is the relay's clock, and $4 whether to
// wake the other relays (see handBackTail, which also returns the rows it found locked:
// those are handed back later by releaseSQL).
const releaseLostSQL = `
WITH mine AS (
    SELECT id, idempotency_key, attempts, lease_expires_at
    FROM outbox
    WHERE status = 'delivering' AND lease_owner = $1 AND lease_expires_at = ANY($2::timestamptz[])` + handBackTail

// unknownConnectorsSQL counts the rows of connectors this relay does not have ($1) that
// wait for a relay that has them: pending ones, and delivering ones whose lease expired
// before $2, the relay's clock (their relay died, and only a relay with the connector
// puts them back). The second part reads outbox_delivering_lease up to $2, as reclaimSQL
// does every poll interval (at least every reclaimInterval). Connectors another running relay has (its word in
// outbox_wake_connectors, see seenSQL, has not lapsed) are left out: their rows have a
// relay, and relays that share a database with different instances would otherwise
// report each other's rows for as long as any wait. They are looked up once per
// connector, after the count: looked up for every row, 100,000 rows of connectors no
// relay has took ten times as long.
const unknownConnectorsSQL = `
SELECT connector, count(*)
FROM (
    SELECT connector FROM outbox WHERE status = 'pending' AND connector <> ALL($1)
    UNION ALL
    SELECT connector FROM outbox WHERE status = 'delivering' AND lease_expires_at < $2 AND connector <> ALL($1)
) waiting
GROUP BY connector
HAVING NOT EXISTS (
    SELECT 1 FROM outbox_wake_connectors w
    WHERE w.connector = waiting.connector AND w.seen_until > clock_timestamp())
ORDER BY connector`

// statsSQL feeds the gauges: the rows waiting, pending (with the age of the oldest,
// against the relay's clock $1) and for a person (held, awaiting approval, dead), by
// connector and status. Each part of the union matches the predicate of a partial index
// (outbox_pending_due, outbox_needs_attention), so the rows read are about the ones
// counted: a single "status IN (...)" is a sequential scan of the whole table, delivered
// rows kept for OUTBOX_RETENTION included (half a second for 500,000 of them, on every
// refresh of every relay). Rows being delivered are not counted: outbox_delivering_lease
// keeps an entry for every row claimed since the table was last vacuumed, and a count
// would visit each one's row (150 ms for the 10,000 claimed in ten seconds at 1,000
// rows/s, while the claims waited); each relay reports the rows it holds as
// outboxd_claimed_rows. The dead entries of outbox_pending_due cost little: the claims
// that scan it from its head mark them as such. The age is a difference of epochs, not
// of timestamps: PostgreSQL before 17 refuses to subtract an infinite one (a created_at
// plain SQL wrote), and one such row would stop every refresh; a row created at
// -infinity is infinitely old, as PostgreSQL 17 has it. The last column is how long the
// oldest due row (next_attempt_at passed) has waited since it fell due: rows scheduled
// for later (a retry's backoff, a not_before) do not count until then, nor do rows that
// wait for an earlier row of their ordering key not finished (the claim's own rule,
// claimDue): they wait for that row (its backoff, an operator), not for a relay, as
// outboxd status has it (internal/ops, statusSQL). The relay parks such rows only when
// it writes the earlier row's failure (parkSQL), so a row enqueued behind it after that
// stays due until its retry, up to OUTBOX_BACKOFF_MAX. The lookup, one probe of
// outbox_ordering_unfinished, is made only for due pending rows with an ordering key.
const statsSQL = `
SELECT connector, status, count(*),
       coalesce(extract(epoch FROM $1::timestamptz) - extract(epoch FROM min(created_at)), 0)::float8,
       coalesce(extract(epoch FROM $1::timestamptz)
                - extract(epoch FROM min(next_attempt_at) FILTER (WHERE next_attempt_at <= $1::timestamptz
                    AND (ordering_key IS NULL OR NOT EXISTS (
                          SELECT 1 FROM outbox p
                          WHERE p.ordering_key = waiting.ordering_key AND p.id < waiting.id
                            AND p.status IN ('pending', 'delivering', 'held', 'awaiting_approval'))))), 0)::float8
FROM (
    SELECT id, connector, status, created_at, next_attempt_at, ordering_key FROM outbox WHERE status = 'pending'
    UNION ALL
    SELECT id, connector, status, created_at, next_attempt_at, NULL FROM outbox WHERE status IN ('dead', 'held', 'awaiting_approval')
) waiting
GROUP BY connector, status`

// retentionSQL deletes up to $2 finished rows of this relay's connectors ($3) last
// changed before $1, after ($4, $5), as finished.DeleteSQL says. Each relay keeps its
// own connectors' rows for its own retention, so relays with different instances on one
// database do not overrule each other; relays sharing an instance delete its rows at the
// shortest of their retentions (the connectors are never NULL: see nonNil).
const retentionSQL = finished.DeleteSQL

// pollFastSQL tells the insert trigger that relay $1 polls fast for its connector
// instances ($2) for the next $3, so inserts need not NOTIFY while every instance running
// relays have is polled fast by some relay (see schema.sql, outbox_wake_connectors).
const pollFastSQL = `
INSERT INTO outbox_wake_connectors AS w (connector, relay_id, polling_until)
SELECT c, $1, clock_timestamp() + $3::interval FROM unnest($2::text[]) AS c
ON CONFLICT (connector, relay_id) DO UPDATE SET polling_until = excluded.polling_until`

// seenSQL tells the insert trigger that relay $1 runs with connector instances $2 for the
// next $3: while one of them has no relay polling fast for it, inserts NOTIFY (see
// schema.sql, outbox_wake_connectors). It also deletes the rows of relays that died
// (neither word renewed for $4), skipping any another relay is deleting. It returns
// the latest seen_until of relay $1 before this renewal and after it, and the database's
// clock: only this relay writes the word of relay $1, so one before that is not the
// after of its own last renewal was written (or withdrawn) by another relay with the
// same id, unless this relay's word had lapsed for so long that a renewal deleted it as
// a dead relay's (see seen).
const seenSQL = `
WITH gone AS (
    DELETE FROM outbox_wake_connectors
    WHERE (connector, relay_id) IN (
        SELECT connector, relay_id FROM outbox_wake_connectors
        WHERE greatest(seen_until, polling_until) < clock_timestamp() - $4::interval
        FOR UPDATE SKIP LOCKED)
), renewed AS (
    INSERT INTO outbox_wake_connectors AS w (connector, relay_id, seen_until)
    SELECT c, $1, clock_timestamp() + $3::interval FROM unnest($2::text[]) AS c
    ON CONFLICT (connector, relay_id) DO UPDATE SET seen_until = excluded.seen_until
    RETURNING seen_until
)
SELECT (SELECT max(seen_until) FROM outbox_wake_connectors WHERE relay_id = $1),
       (SELECT max(seen_until) FROM renewed),
       clock_timestamp()`

// withdrawSQL deletes, for relay $1 that stops, its words in outbox_wake_connectors (see
// Relay.withdraw): that it has its instances and polls fast for them. Other relays' words
// about the same instances stand. It also wakes the relays still running (NOTIFY, sent
// at commit): while its mark stood, inserts of its instances sent none, and the rows it
// had no room to claim are still pending, for them now.
const withdrawSQL = `
WITH gone AS (
    DELETE FROM outbox_wake_connectors WHERE relay_id = $1
)
SELECT pg_notify('` + notifyChannel + `', '')`

// missingPrivilegesSQL names the current role and the privileges the relay uses on the
// outbox's tables that it lacks, per table ("UPDATE on outbox; INSERT on
// outbox_attempts"; empty when none): first those that claims and outcomes need (they
// read and update outbox and log to outbox_attempts), then those that retention needs
// (it deletes from both; its trigger deletes the attempts). A column grant on every
// column the relay uses would do for SELECT and UPDATE, so one on any column passes
// here. The tables are found along the search_path, as the relay's statements find
// them. outbox_wake_connectors is not asked for: a relay without it still delivers, and
// says why in its log every renewal.
const missingPrivilegesSQL = `
SELECT current_user,
       coalesce(string_agg(privs || ' on ' || t, '; ' ORDER BY tord) FILTER (WHERE NOT retention), ''),
       coalesce(string_agg(privs || ' on ' || t, '; ' ORDER BY tord) FILTER (WHERE retention), '')
FROM (SELECT tord, t, retention, string_agg(p, ', ' ORDER BY pord) AS privs
      FROM (VALUES (1, 'outbox', 1, 'SELECT'), (1, 'outbox', 2, 'UPDATE'), (1, 'outbox', 3, 'DELETE'),
                   (2, 'outbox_attempts', 1, 'SELECT'), (2, 'outbox_attempts', 2, 'INSERT'),
                   (2, 'outbox_attempts', 3, 'DELETE')) AS v (tord, t, pord, p)
           CROSS JOIN LATERAL (SELECT p = 'DELETE') AS k (retention)
      WHERE NOT CASE p WHEN 'DELETE' THEN has_table_privilege(t, p) ELSE has_any_column_privilege(t, p) END
      GROUP BY tord, t, retention) AS m`
