// Package replaylock is the lock that keeps an operator's replay from racing a relay's
// claim of the rows of an ordering key.
//
// A replay puts a finished row back to pending, which makes it an unfinished row ahead
// of the later rows of its key again. A claim statement whose snapshot was taken before
// the replay committed still reads that row as finished, and may lock and claim the
// key's next row after the commit, while a claim with a newer snapshot, which does not
// yet see that claim, takes the replayed row: two rows of one key in flight at once. So
// every claim round of a relay holds this lock shared for its transaction, from before
// its claim statements take their snapshots, and a replay that puts back rows with
// ordering keys holds it alone, from before it changes them: the replay waits for the
// claim rounds under way, and the rounds after it see it committed.
package replaylock

// key is the advisory lock's key: "obxd" (0x6f627864) in the high half, and in the low
// half the oid of the outbox table the session finds, so that installations in other
// schemas of one database do not share it.
const key = `(1868724324::bigint << 32) | 'outbox'::regclass::oid::bigint`

// ClaimSQL takes the lock shared until the transaction ends: a relay's claim round.
const ClaimSQL = `SELECT pg_advisory_xact_lock_shared(` + key + `)`

// ReplayLimitsSQL bounds, for the rest of a replay's transaction, what it may keep the
// relays waiting for: while a replay holds the lock, or waits for it (PostgreSQL queues
// the claim rounds that ask after it behind it), no relay claims a row, nor records the
// outcomes that ride with its claims (a relay that only records them goes on).
//
// Its session is ended should its client leave it idle in the transaction for five
// seconds: a replay whose client stood still (a process suspended, an operator's laptop
// asleep, a network gone) held the lock until the server noticed the session was gone,
// which with TCP keepalive's defaults takes hours. A replay sends the statements of a
// batch one after the other, and never idles that long otherwise.
//
// It waits five seconds at most for a lock (lock_timeout), this one or a row's, and then
// fails: claim rounds take milliseconds, but one that stood still while holding the lock
// shared (its relay's process frozen while the database sent it a large batch, or a
// round behind a pooler whose client was gone, waiting for a row) kept the replay
// waiting, and every relay behind it, for as long as it lasted. Run before ReplaySQL.
const ReplayLimitsSQL = `SELECT set_config('idle_in_transaction_session_timeout', '5s', true),
       set_config('lock_timeout', '5s', true)`

// ReplaySQL takes the lock alone until the transaction ends when one of rows $1 (ids)
// has an ordering key: a replay, before it changes them.
const ReplaySQL = `SELECT pg_advisory_xact_lock(` + key + `)
WHERE EXISTS (SELECT 1 FROM outbox WHERE id = ANY($1) AND ordering_key IS NOT NULL)`
