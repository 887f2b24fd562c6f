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

// ReplayIdleSQL ends the session of a replay's transaction, should its client leave it
// idle in the transaction for five seconds: while a replay holds the lock, no relay claims
// a row or records an outcome, and a replay whose client stood still (a process
// suspended, an operator's laptop asleep, a network gone) held it until the server
// noticed the session was gone, which with TCP keepalive's defaults takes hours. A replay
// sends the statements of a batch one after the other, and never idles that long
// otherwise. Set for the transaction only, before ReplaySQL.
const ReplayIdleSQL = `SELECT set_config('idle_in_transaction_session_timeout', '5s', true)`

// ReplaySQL takes the lock alone until the transaction ends when one of rows $1 (ids)
// has an ordering key: a replay, before it changes them.
const ReplaySQL = `SELECT pg_advisory_xact_lock(` + key + `)
WHERE EXISTS (SELECT 1 FROM outbox WHERE id = ANY($1) AND ordering_key IS NOT NULL)`
