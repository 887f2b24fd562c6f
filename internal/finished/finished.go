// Package finished holds what the relay's retention and the operators' purge share:
// deleting the outbox's finished rows (delivered and canceled) in batches.
package finished

// DeleteSQL deletes up to $2 finished rows last changed before $1 (their attempts go
// with them), of connector instances $3, or of every instance when $3 is NULL. The rows
// are locked as they are chosen, and rows another transaction holds are skipped: a
// replay may be moving one back to pending, and a DELETE that waited for it would check
// only the id once the replay committed, and delete the replayed row.
//
// It takes the rows after ($4, $5), the (updated_at, id) of the last row the previous
// batch deleted (-infinity and the least bigint for the first), and returns how many it
// deleted and its own last row's, from which the next batch starts: while any
// transaction holds a snapshot older than a deleted row (a long report, a backup, a
// standby's feedback), the row's entry in outbox_finished_age stays live to every scan,
// and a batch that started at the oldest entry read every row the pass had deleted so
// far (with one such snapshot, the 32nd batch of 1,000 read 32,000 rows, 3,300 buffers
// against the first's 106).
const DeleteSQL = `
WITH expired AS (
    SELECT id FROM outbox
    WHERE status IN ('delivered', 'canceled') AND updated_at < $1
      AND ($3::text[] IS NULL OR connector = ANY($3))
      AND (updated_at, id) > ($4::timestamptz, $5::bigint)
    ORDER BY updated_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM outbox o USING expired e WHERE o.id = e.id
    RETURNING o.id, o.updated_at
)
SELECT count(*), max(updated_at), (array_agg(id ORDER BY updated_at DESC, id DESC))[1]
FROM gone`
