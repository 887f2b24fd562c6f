package ops

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/replaylock"
	"github.com/outboxd/outboxd/outbox"
)

// Selection names the rows a command acts on: either Keys or Filter, not both.
type Selection struct {
	// Keys are idempotency keys; repeats count once.
	Keys []string `json:"keys,omitempty"`
	// Filter selects rows as [List] does, every page of it. Its Limit caps the number of
	// rows selected (zero: no cap); After is ignored. Its Status is checked again as each
	// row is locked, as Statuses is.
	Filter *Filter `json:"filter,omitempty"`
	// Statuses, when set, are the statuses the selected rows were chosen for (with Keys:
	// the Filter.Status of the selection a dry run planned). A row found in another
	// status once locked (one a relay delivered since, which Redeliver would send again)
	// is refused, as changed since it was selected; one pending since is unchanged.
	Statuses []string `json:"statuses,omitempty"`
}

// ReplayOptions control [Replay].
type ReplayOptions struct {
	// Actor names who replays, for the audit trail. Required.
	Actor string
	// Reason says why, for the audit trail.
	Reason string
	// DryRun computes the same result and changes nothing.
	DryRun bool
	// Redeliver allows replaying delivered rows, which sends them again.
	Redeliver bool
	// NewKey re-executes each row as a new intent under a key derived from the old one,
	// instead of putting the row itself back. See [Replay].
	NewKey bool
	// BatchSize is how many rows each transaction takes. Defaults to 500.
	BatchSize int
	// Rate caps the rows replayed per second. Defaults to no cap.
	Rate float64
	// Stop, when closed, ends the replay between batches: the batch under way commits,
	// and Replay returns what it did with [ErrReplayStopped]. ctx, cancelled, ends it
	// where it is instead, rolling back the batch under way.
	Stop <-chan struct{}
	// ProgressFunc, when set, is called after each batch with the rows handled so far
	// and the rows selected.
	ProgressFunc func(done, total int)
	// KeyWindowFunc, when set, says how long the receiver of a connector instance
	// ("payment", "payment:eu") remembers idempotency keys and how long an attempt of it
	// may last, as the relays that deliver the instance have them; a zero Window when it
	// does not forget them, or is not known. A row whose next attempt under its own key
	// could reach the receiver after that window has passed since its first attempt is
	// refused without NewKey: a relay would hold it again at once without sending it
	// (see [connectors.KeyForgotten]).
	KeyWindowFunc func(connector string) KeyWindow
	// Now is the replay's clock: next_attempt_at, lease expiry, audit time, and the ages
	// of a Filter without a Now of its own. Defaults to the database's current time as
	// each batch runs (at the start, for the Filter), the clock leases are set by.
	Now time.Time
}

// KeyWindow is how long a connector instance's receiver remembers idempotency keys
// ([connectors.KeyWindower]; zero: for ever, or not known) and the longest one attempt of
// it may last, as a relay delivering the instance has them ([connectors.KeyForgotten]).
type KeyWindow struct {
	Window     time.Duration
	AttemptMax time.Duration
}

// ReplayResult says what [Replay] did (or, with DryRun, would do) with each selected key.
type ReplayResult struct {
	// Replayed are keys put back to pending (or, with NewKey, re-executed as a new row).
	Replayed []string `json:"replayed"`
	// Unchanged are keys already pending (or, with NewKey, whose previous new-key copy
	// is still on its way), so there was nothing to do.
	Unchanged []string `json:"unchanged"`
	// Refused maps keys left alone to the reason, a sentence for a person.
	Refused map[string]string `json:"refused"`
	// NewKeys maps old keys to the key of the row that re-executes them (NewKey). With
	// NewKey it is there when empty ({}), as the other fields are, for scripts that read
	// it; without, it is left out.
	NewKeys map[string]string `json:"new_keys,omitzero"`
	// NotFound are keys no row has (Keys selections, or rows deleted meanwhile).
	NotFound []string `json:"not_found"`
	// Ambiguous maps the Replayed keys an attempt of which may have reached the receiver
	// (stuck in delivering, or held or dead after an ambiguous attempt, or delivered once
	// and replayed since; or such an attempt of a copy that NewKey made of the row, or of
	// the row a copy copies, or of its other copies) to
	// their connector: sending them again may have the receiver
	// act twice, unless it enforces the key ([GuaranteeNote]; with NewKey, whatever it
	// guarantees). Delivered rows (Redeliver) are not in it: the CLI explains them apart.
	Ambiguous map[string]string `json:"ambiguous"`
	// AmbiguousByCopy are the keys of Ambiguous, put back under their own key (without
	// NewKey), an attempt of another row of whose operation may have reached the
	// receiver (a copy that NewKey made of the row, or the row a copy copies, or its
	// other copies): that attempt carried another key, so the receiver acts again
	// whatever it guarantees, as for a new key. The CLI says so instead of what the
	// guarantee means for the same key.
	AmbiguousByCopy []string `json:"-"`
	DryRun          bool     `json:"dry_run"`
}

// errRollback ends a dry run's transaction without an error.
var errRollback = errors.New("dry run: roll back")

// replaySQL puts rows $1 back to pending at $2. A row stuck in delivering (its lease
// expired) is treated as the relay's reclaim treats it: the abandoned attempt is logged as
// ambiguous and the row stays marked ambiguous, so the next attempt knows the receiver
// may already have acted, and a late delivery from the vanished relay is still accepted
// (relay/sql.go, recordSQL). A dead or held row keeps its ambiguous mark for the same
// reason: its relay may still write the outcome of that attempt (it lost the database,
// and reclaim put the row away), and a delivery is the truth. (Any other late answer
// is logged but leaves the replayed row pending.) last_error, attempts and
// the attempt log are kept. Both statements read the rows as they were before the UPDATE.
const replaySQL = `
WITH stuck AS (
    INSERT INTO outbox_attempts (outbox_id, attempt, relay_id, started_at, finished_at, outcome, ambiguous, error)
    SELECT id, attempts, lease_owner, updated_at, $2, 'lease_expired', true,
           'lease expired before the outcome was recorded; an operator replayed the row'
    FROM outbox
    WHERE id = ANY($1) AND status = 'delivering'
)
UPDATE outbox
SET status = 'pending', next_attempt_at = $2, ambiguous = (status = 'delivering' OR ambiguous),
    lease_owner = NULL, lease_expires_at = NULL, delivered_at = NULL, updated_at = $2
WHERE id = ANY($1)`

// waitLaterClaimsSQL waits for the transactions that lock (claim) a pending row that
// follows one of rows $1 in its ordering key. FOR KEY SHARE conflicts with the claim's
// FOR UPDATE only; claims never wait for a row (a claim round waits only for the replay
// lock, before it holds any), so this cannot deadlock with them.
const waitLaterClaimsSQL = `
SELECT 1 FROM outbox l JOIN outbox r ON l.ordering_key = r.ordering_key AND l.id > r.id
WHERE r.id = ANY($1) AND l.status = 'pending'
FOR KEY SHARE OF l`

// copySQL reads what a new-key replay copies from row $1.
const copySQL = `
SELECT o.connector, o.payload, coalesce(o.ordering_key, ''), o.headers, coalesce(o.created_by, '')
FROM outbox o WHERE o.id = $1`

// copiesOfSQL finds which of the keys $1 are copies that a new-key replay made, of
// which row's key, and that row's connector. It reads every replay's audit entry (there
// is no index on new_key), once a batch.
const copiesOfSQL = `
SELECT a.details->>'new_key', o.idempotency_key, o.connector
FROM outbox_audit a JOIN outbox o ON o.id = a.outbox_id
WHERE a.action = 'replay' AND a.details->>'new_key' = ANY($1::text[])`

// Original is the row a copy that replay --new-key made copies, as [CopiesOf] finds it.
type Original struct {
	Key       string
	Connector string
}

// copiesOf maps those of the rows b that are copies a new-key replay made to the key of
// the row each copies.
func copiesOf(ctx context.Context, tx pgx.Tx, b []target) (map[string]string, error) {
	keys := make([]string, len(b))
	for i, t := range b {
		keys[i] = t.key
	}
	found, err := originals(ctx, tx, keys)
	if err != nil {
		return nil, fmt.Errorf("look up copies: %w", err)
	}
	out := make(map[string]string, len(found))
	for cp, of := range found {
		out[cp] = of.Key
	}
	return out, nil
}

// originals maps those of keys that are copies a new-key replay made to the row each
// copies, in one query (copiesOfSQL).
func originals(ctx context.Context, db outbox.DB, keys []string) (map[string]Original, error) {
	return byKey(ctx, db, copiesOfSQL, keys, func(rows pgx.Rows, cp *string, of *Original) error {
		return rows.Scan(cp, &of.Key, &of.Connector)
	})
}

// byKey runs query, whose $1 is keys, and maps the key in each row's first column to
// what scan reads of the row; it asks nothing when keys is empty.
func byKey[T any](ctx context.Context, db outbox.DB, query string, keys []string, scan func(rows pgx.Rows, key *string, v *T) error) (map[string]T, error) {
	out := map[string]T{}
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, query, keys)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var v T
		if err := scan(rows, &key, &v); err != nil {
			return nil, err
		}
		out[key] = v
	}
	return out, rows.Err()
}

// copyKey matches the keys replay --new-key gives copies, outbox.Key(key, "replay", n):
// a readable part that ends "/replay/<n>", or was cut at 80 characters (a long key),
// then '~' and the hash. Only such keys are looked up by [CopyOf] and [CopiesOf], since
// copiesOfSQL reads every replay's audit entry, and the intent API asks for every key it
// is given (agents' keys from key parts are outbox.Key's too).
var copyKey = regexp.MustCompile(`^(?:[A-Za-z0-9._/-]{80}|[A-Za-z0-9._/-]*/replay/[0-9]+)~[a-z2-7]{26}$`)

// CopyOf returns the key of the row that replay --new-key made the row with key a copy
// of, or "" when key is no such copy (copiesOfSQL).
func CopyOf(ctx context.Context, db outbox.DB, key string) (string, error) {
	if !copyKey.MatchString(key) {
		return "", nil
	}
	found, err := originals(ctx, db, []string{key})
	if err != nil {
		return "", fmt.Errorf("look up the row %q copies: %w", key, err)
	}
	return found[key].Key, nil
}

// CopiesOf maps those of keys that are copies replay --new-key made to the row each
// copies, as [CopyOf] finds it for one key, in one query for all (none when no key has
// a copy's form): a page of a listing asks it for every row.
func CopiesOf(ctx context.Context, db outbox.DB, keys []string) (map[string]Original, error) {
	var copies []string
	for _, k := range keys {
		if copyKey.MatchString(k) {
			copies = append(copies, k)
		}
	}
	found, err := originals(ctx, db, copies)
	if err != nil {
		return nil, fmt.Errorf("look up copies: %w", err)
	}
	return found, nil
}

// copiesMadeOfSQL counts the new-key replays each of the rows with keys $1 has had, for
// those that had any.
const copiesMadeOfSQL = `
SELECT o.idempotency_key, count(*) FROM outbox_audit a JOIN outbox o ON o.id = a.outbox_id
WHERE o.idempotency_key = ANY($1::text[]) AND a.action = 'replay' AND a.details->>'new_key' IS NOT NULL
GROUP BY o.idempotency_key`

// LatestCopy returns the key of the latest copy that replay --new-key made of the row
// with key (copiesMadeOfSQL), or "" when it made none. Its copies are one line, each
// made once the one before was finished (see [Replay]), so the latest is where the
// row's operation went; it may be gone since (delivered or canceled, then deleted by
// retention or purge).
func LatestCopy(ctx context.Context, db outbox.DB, key string) (string, error) {
	latest, err := LatestCopies(ctx, db, []string{key})
	return latest[key], err
}

// LatestCopies maps those of keys whose rows replay --new-key copied to the key of the
// latest copy, as [LatestCopy] finds it for one key, in one query for all.
func LatestCopies(ctx context.Context, db outbox.DB, keys []string) (map[string]string, error) {
	latest, err := byKey(ctx, db, copiesMadeOfSQL, keys, func(rows pgx.Rows, key *string, latest *string) error {
		var n int
		err := rows.Scan(key, &n)
		*latest = outbox.Key(*key, "replay", strconv.Itoa(n))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("look up copies made: %w", err)
	}
	return latest, nil
}

// statusOfSQL reads the connector and status of the rows with keys $1.
const statusOfSQL = `SELECT idempotency_key, connector, status FROM outbox WHERE idempotency_key = ANY($1::text[])`

// RowStatus is a row's connector and status, as [StatusOf] reads them.
type RowStatus struct {
	Connector string
	Status    string
}

// StatusOf maps those of keys that name a row to its connector and status, in one query:
// the copies [LatestCopies] (or [LatestCopy], for inspect) names, and no row when such a
// copy is gone (delivered or canceled, then deleted by retention or purge, which delete
// no other rows).
func StatusOf(ctx context.Context, db outbox.DB, keys []string) (map[string]RowStatus, error) {
	status, err := byKey(ctx, db, statusOfSQL, keys, func(rows pgx.Rows, key *string, st *RowStatus) error {
		return rows.Scan(key, &st.Connector, &st.Status)
	})
	if err != nil {
		return nil, fmt.Errorf("look up rows: %w", err)
	}
	return status, nil
}

// statusByKeySQL reads the status of the row with key $1.
const statusByKeySQL = `SELECT status FROM outbox WHERE idempotency_key = $1`

// lockStatusSQL reads the status of the row with key $1 and locks it FOR KEY SHARE,
// unless another transaction holds it FOR UPDATE (see operationStatus).
const lockStatusSQL = `SELECT status FROM outbox WHERE idempotency_key = $1 FOR KEY SHARE SKIP LOCKED`

// keyExistsSQL says whether a row has key $1; it takes no lock.
const keyExistsSQL = `SELECT EXISTS (SELECT 1 FROM outbox WHERE idempotency_key = $1)`

// operationStatus returns the status of the row with key ("" when there is none),
// another row of the operation of a row this replay decides on (a copy that replay
// --new-key made of it, or the row it copies), and locks it until the replay commits.
// Read as last committed, it could be changing under another replay at the same time:
// a replay of a row and one of its copy, each reading the other's row as it was, both
// put theirs back, and the operation ran twice more. A replay (or cancel, approve,
// reject) holds its rows FOR UPDATE, which conflicts with FOR KEY SHARE: skipped rather
// than waited for, the row is then refused for a moment (refused says why, and status
// is empty), as lockSQL's skipped rows are; and the other replay, or a later one, skips
// the row this one locked. A relay recording an outcome (FOR NO KEY UPDATE) is neither
// held off nor waited for.
func operationStatus(ctx context.Context, tx pgx.Tx, key string) (status, refused string, err error) {
	err = tx.QueryRow(ctx, lockStatusSQL, key).Scan(&status)
	if err == nil {
		return status, "", nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("look up %q: %w", key, err)
	}
	var exists bool // skipped, or there is none
	if err := tx.QueryRow(ctx, keyExistsSQL, key).Scan(&exists); err != nil {
		return "", "", fmt.Errorf("look up %q: %w", key, err)
	}
	if exists {
		return "", fmt.Sprintf("another transaction holds %q, a row of the same operation (a copy that replay --new-key made, "+
			"or the row it copies): a replay or cancel of it may be in progress; look again in a moment", key), nil
	}
	return "", "", nil
}

// Replay puts the selected rows back to pending now, oldest first (so that rows of an
// ordering key are put back in their order), in batches of opts.BatchSize rows, each
// batch its own short transaction. It is safe while relays run: each batch locks its
// rows with FOR UPDATE SKIP LOCKED, so a row a relay is recording an outcome for is
// reported as refused and left to the relay, never overwritten; and a row in flight
// (delivering with a live lease) is refused too. A batch that puts back rows of
// ordering keys first waits for the relays' claim rounds under way, and holds off new
// ones until it commits (internal/replaylock); after five seconds of waiting for a lock
// it fails, to be run again, and one whose client stands still in it for five seconds
// has its session ended by the server. Rows the relay parked behind a replayed row
// (outbox.ParkedBehind) become due at once, to go after it.
//
// By status:
//
//   - dead, held: replayed. ambiguous is kept, so a late delivery of the attempt that
//     made it ambiguous is still recorded (a late failure is logged, and the row stays
//     replayed); last_error, attempts and the attempt log are kept.
//   - delivering whose lease expired before opts.Now (stuck): replayed like the relay's
//     own reclaim, the abandoned attempt logged as ambiguous. With a live lease: refused.
//   - delivered: refused unless opts.Redeliver. Read [GuaranteeNote] first.
//   - pending: unchanged, so replaying twice is harmless.
//   - canceled: refused, with NewKey too (it may be one an approver rejected).
//   - awaiting_approval: refused; approval is decided by approve or reject.
//   - a row whose payload was purged: refused, since there is nothing left to send.
//   - a row past its key window (opts.KeyWindowFunc): refused without NewKey, since a
//     relay would hold it again at once without sending it; the reason says what to do.
//
// Every replayed row gets an outbox_audit row (action replay, opts.Actor, opts.Reason,
// details {"from_status": ...}). Replayed rows an attempt of which may have reached the
// receiver are listed in ReplayResult.Ambiguous, with their connector.
//
// With opts.NewKey the row itself is left as it is and a new intent re-executes it:
// same connector, payload, ordering key and headers, under the key
// outbox.Key(oldKey, "replay", n) for the row's n-th new-key replay, enqueued with
// [outbox.Enqueue] (so its fingerprint is its own). Keeping the old row keeps the
// receiver's record of the old key truthful: rewriting its key would let a later enqueue
// of the old key run the operation a third time. The old row's audit entry records
// {"new_key": ...}. Copies are enqueued in the order of the rows they copy, so copies
// sharing an ordering key keep their rows' order. While the previous copy is still on
// its way (pending, delivering, held, awaiting approval), replaying again is unchanged
// rather than a third execution; once it was delivered (or is gone: retention and purge
// delete only delivered and canceled rows), replaying again is refused unless
// opts.Redeliver, as for a delivered row. A copy itself is refused with NewKey, so that
// an operation has one line of copies, which its row's replays follow (a filter may
// select a row and its dead copy together). The row a copy re-executes is put back under
// its own key (without NewKey) on the same terms: refused while its latest copy is on
// its way, and once that was delivered (or is gone) unless opts.Redeliver, since the
// receiver never saw the row's own key and would act again; and refused while that copy
// is dead, the operation's current row, which is replayed instead. Of a row's copies,
// only the latest is put back under its own key, and not together with the row (which
// Redeliver puts back once that copy was delivered): the first of the two, the row, is,
// the other refused, and the copy is refused while the row is on its way again. Each
// such decision locks the other row it reads (operationStatus), so that two replays at
// once, of a row and of its copy, do not both go ahead: one is refused for a moment.
// A stuck delivering row is refused with NewKey (the relay would retry it as well), as
// is a held row with an ordering key (it would hold its copy back forever: cancel it and
// enqueue a new intent).
//
// The error wraps [ErrInvalidFilter] or [ErrInvalidOptions] for a bad selection or
// options, in which case nothing was changed. An error from a later batch leaves the
// earlier batches committed; the result returned with it covers them.
func Replay(ctx context.Context, pool *pgxpool.Pool, sel Selection, opts ReplayOptions) (ReplayResult, error) {
	res := ReplayResult{
		Replayed: []string{}, Unchanged: []string{}, Refused: map[string]string{}, NotFound: []string{},
		Ambiguous: map[string]string{}, DryRun: opts.DryRun,
	}
	if opts.NewKey {
		res.NewKeys = map[string]string{}
	}
	if opts.Actor == "" {
		return res, fmt.Errorf("%w: Actor: say who replays, for the audit trail", ErrInvalidOptions)
	}
	if !(opts.Rate >= 0) || math.IsInf(opts.Rate, 1) { // NaN too, which caps nothing
		return res, fmt.Errorf("%w: Rate: %g is not a number of rows per second", ErrInvalidOptions, opts.Rate)
	}
	now, err := dbNowOr(ctx, pool, opts.Now)
	if err != nil {
		return res, err
	}
	targets, notFound, err := resolve(ctx, pool, sel, now)
	if err != nil {
		return res, err
	}
	res.NotFound = append(res.NotFound, notFound...)
	// The statuses the rows were selected for, checked again under each row's lock: a
	// filter's rows are read before their batch locks them, a paced replay's minutes
	// before.
	statuses := sel.Statuses
	if sel.Filter != nil && len(sel.Filter.Status) > 0 {
		statuses = sel.Filter.Status
	}
	// Oldest first, not newest first (a filter's order) or as the keys were typed. Each
	// batch commits on its own, and a relay may send what one put back before the next
	// runs (a paced replay waits between them): a later row of an ordering key put back
	// first would go out while an earlier row of its key, put back by a later batch, was
	// still dead. Copies (NewKey) are new rows, their ids drawn as they are enqueued: in
	// the order of the rows they copy, so that copies sharing an ordering key go out in
	// their rows' order.
	slices.SortFunc(targets, func(a, b target) int { return cmp.Compare(a.id, b.id) })

	size := batchSize(opts.BatchSize)
	if opts.Rate > 0 {
		size = min(size, max(1, int(opts.Rate))) // about one batch a second
	}
	start, done := time.Now(), 0
	// The row each operation is put back as, by the key of the row a copy copies (see
	// replayBatch), over every batch, so that a dry run, which commits none, decides as
	// the run does.
	ran := map[string]string{}
	for _, b := range batches(targets, size) {
		select {
		case <-opts.Stop:
			return res, ErrReplayStopped
		default:
		}
		var br ReplayResult
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			br = ReplayResult{Refused: map[string]string{}, NewKeys: map[string]string{}, Ambiguous: map[string]string{}}
			// The clock of this batch, not of the replay's start: a paced replay runs for
			// minutes, and leases expire meanwhile; the batch's audit entries are stamped
			// with it too.
			now, err := dbNowOr(ctx, tx, opts.Now)
			if err != nil {
				return err
			}
			if err := replayBatch(ctx, tx, b, opts, statuses, now, ran, &br); err != nil {
				return err
			}
			if opts.DryRun {
				return errRollback
			}
			if len(br.Replayed) > 0 {
				// Wake idle relays at commit, as an insert would, instead of leaving the
				// rows to their next poll.
				if _, err := tx.Exec(ctx, `SELECT pg_notify('outbox', '')`); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil && !errors.Is(err, errRollback) {
			return res, fmt.Errorf("replay: %w", err)
		}
		res.merge(br)
		done += len(b)
		if opts.ProgressFunc != nil {
			opts.ProgressFunc(done, len(targets))
		}
		if opts.Rate > 0 && done < len(targets) {
			due := start.Add(time.Duration(float64(done) / opts.Rate * float64(time.Second)))
			if err := sleepUntil(ctx, opts.Stop, due); err != nil {
				if errors.Is(err, ErrReplayStopped) {
					return res, err
				}
				return res, fmt.Errorf("replay: %w", err)
			}
		}
	}
	return res, nil
}

func (r *ReplayResult) merge(b ReplayResult) {
	r.Replayed = append(r.Replayed, b.Replayed...)
	r.Unchanged = append(r.Unchanged, b.Unchanged...)
	r.AmbiguousByCopy = append(r.AmbiguousByCopy, b.AmbiguousByCopy...)
	r.NotFound = append(r.NotFound, b.NotFound...)
	for k, v := range b.Refused {
		r.Refused[k] = v
	}
	for k, v := range b.Ambiguous {
		r.Ambiguous[k] = v
	}
	if r.NewKeys != nil {
		for k, v := range b.NewKeys {
			r.NewKeys[k] = v
		}
	}
}

// replayBatch replays one batch in tx, recording the outcome of each key in br. ran maps
// the key of each row put back under its own key so far, or of the row it copies (a
// copy that NewKey made), to the key of the row put back.
func replayBatch(ctx context.Context, tx pgx.Tx, b []target, opts ReplayOptions, statuses []string, now time.Time, ran map[string]string,
	br *ReplayResult) error {
	if !opts.NewKey && !opts.DryRun {
		// Before any row is locked (a claim round waiting for this one may be writing
		// outcomes of such rows): see internal/replaylock. A copy (NewKey) is a new row
		// behind the others of its key, and needs none; nor does a dry run, which
		// changes nothing and would hold off every relay while it runs.
		if _, err := tx.Exec(ctx, replaylock.ReplayLimitsSQL); err != nil {
			return fmt.Errorf("limit how long the replay may hold the relays off: %w", err)
		}
		if _, err := tx.Exec(ctx, replaylock.ReplaySQL, ids(b)); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available: ReplayLimitsSQL's lock_timeout
				// The bare "canceling statement due to lock timeout" says neither what held
				// the replay nor whether to run it again.
				return fmt.Errorf("wait for claims under way: a relay's claim round held the replay off for five seconds, "+
					"so this batch was left as it was (earlier batches stay replayed); running the replay again is safe: %w", err)
			}
			return fmt.Errorf("wait for claims under way: %w", err)
		}
	} else if err := limitIdle(ctx, tx); err != nil {
		// ReplayLimitsSQL's idle limit, without its wait for claims: the rows are locked
		// all the same, and a client that stood still here would hold off a relay
		// recording the outcome of a row before one of them in its ordering key.
		return err
	}
	locked, err := lockRows(ctx, tx, ids(b))
	if err != nil {
		return err
	}
	var (
		replayIDs []int64
		auditIDs  []int64
		details   []string
		copyOf    map[string]string
		made      map[int64]int
	)
	if copyOf, err = copiesOf(ctx, tx, b); err != nil {
		return err
	}
	if made, err = copiesMade(ctx, tx, b); err != nil {
		return err
	}
	for _, t := range b {
		r, ok := locked[t.id]
		if !ok {
			if err := skipped(ctx, tx, t, &br.NotFound, br.Refused); err != nil {
				return err
			}
			continue
		}
		stuck := r.status == outbox.StatusDelivering && r.leaseExpiresAt != nil && r.leaseExpiresAt.Before(now)
		switch {
		case r.status == outbox.StatusPending:
			br.Unchanged = append(br.Unchanged, t.key)
			continue
		case len(statuses) > 0 && !slices.Contains(statuses, r.status):
			br.Refused[t.key] = fmt.Sprintf("it is %s now, no longer %s as when it was selected; look at it again "+
				"(outboxd inspect) and replay it by key if it should still go", r.status, strings.Join(statuses, " or "))
			continue
		case r.status == outbox.StatusCanceled:
			// With NewKey too: a canceled row may be one an approver rejected, and its copy
			// would go out without approval.
			br.Refused[t.key] = "canceled rows stay canceled; enqueue a new intent to act after all"
			continue
		case r.status == outbox.StatusAwaitingApproval:
			br.Refused[t.key] = "awaiting approval: approve or reject it instead"
			continue
		case r.status == outbox.StatusDelivered && !opts.Redeliver:
			br.Refused[t.key] = "already delivered; replaying would send it again, so it needs Redeliver (--redeliver)"
			continue
		case r.status == outbox.StatusDelivering && !stuck:
			br.Refused[t.key] = fmt.Sprintf("in flight: relay %s holds its lease until %s",
				r.leaseOwner, r.leaseExpiresAt.UTC().Format(time.RFC3339))
			continue
		case r.payloadPurged:
			br.Refused[t.key] = "its payload was purged, so there is nothing left to send"
			continue
		}
		d := map[string]string{"from_status": r.status}
		// op is the key of the row whose operation this row executes: the row a copy that
		// NewKey made copies, or the row itself.
		op, isCopy := copyOf[t.key]
		if !isCopy {
			op = t.key
		}
		if opts.NewKey {
			if isCopy {
				// The copy is the operation of the row it copies, whose next new-key replay
				// looks only at its own copies: a copy of the copy would go unseen, and
				// both would execute the operation (a filter such as --status dead selects
				// the row and its dead copy together).
				var st string
				if err := tx.QueryRow(ctx, statusByKeySQL, op).Scan(&st); err != nil && !errors.Is(err, pgx.ErrNoRows) {
					return fmt.Errorf("look up %q: %w", op, err)
				}
				if st == outbox.StatusCanceled {
					// Which its replay refuses: an operator clears a held row that way once
					// its copy re-executes it.
					br.Refused[t.key] = fmt.Sprintf("a copy that replay --new-key made of %q, which was canceled, so it cannot "+
						"be re-executed with a new key: replay this copy without --new-key, or enqueue a new intent", op)
					continue
				}
				br.Refused[t.key] = fmt.Sprintf("a copy that replay --new-key made of %q: re-execute that row instead, "+
					"once this copy is finished or canceled, so that the operation runs once more, not twice", op)
				continue
			}
			newKey, changed, reason, err := replayNewKey(ctx, tx, r, made[r.id], opts.Redeliver)
			if err != nil {
				return err
			}
			if reason != "" {
				br.Refused[t.key] = reason
				continue
			}
			br.NewKeys[t.key] = newKey
			if !changed {
				br.Unchanged = append(br.Unchanged, t.key)
				continue
			}
			d["new_key"] = newKey
		} else {
			// A row that replay --new-key re-executed stays dead or held, so a plain replay
			// (--status dead, run for the rows that died since) selects it too: under its own
			// key, which the receiver never acted on, it would execute the operation beside
			// its copy, or after it.
			reason, err := replayCopied(ctx, tx, r, made[r.id], opts.Redeliver)
			if err != nil {
				return err
			}
			if isCopy && reason == "" {
				// Of the copies of one row, only the latest is the operation's current row:
				// replay --status dead, after two rounds of --new-key against a receiver
				// still broken, selects both dead copies, and would put both back.
				if reason, err = laterCopy(ctx, tx, t.key, op); err != nil {
					return err
				}
			}
			if reason == "" && opts.KeyWindowFunc != nil {
				// After the copies' reasons, which say where the operation went (a copy
				// delivered, or on its way): refused for its window instead, the row read
				// as an operation to re-execute once the receiver showed that its own key
				// had done nothing.
				of := ""
				if isCopy {
					of = op
				}
				reason = pastKeyWindow(r, opts.KeyWindowFunc(r.connector), now, of)
			}
			if other, ok := ran[op]; ok && reason == "" {
				// With Redeliver, a row whose copy was delivered is put back, and so is that
				// copy (the latest): selected together (--key both, a filter of both
				// statuses), each went back under its own key, and the operation ran twice.
				reason = fmt.Sprintf("this replay puts back %q, the same operation (a copy that replay --new-key made, "+
					"or the row it copies): putting this one back too would execute the operation twice", other)
			}
			if reason != "" {
				br.Refused[t.key] = reason
				continue
			}
			ran[op] = t.key
			replayIDs = append(replayIDs, r.id)
		}
		br.Replayed = append(br.Replayed, t.key)
		if r.status != outbox.StatusDelivered && (isCopy || made[r.id] > 0) {
			// A copy that replay --new-key made of the row is the same operation, as is
			// the row a copy copies, and its other copies: an attempt of one may have
			// reached the receiver, and executing the row again may have the receiver act
			// twice, as after one of the row's own. Looked up for a row whose own attempt
			// may have too: under the row's own key, the receiver's record of that key
			// does not cover what the others did.
			byCopy, err := otherReached(ctx, tx, op, t.key)
			if err != nil {
				return err
			}
			if byCopy && !opts.NewKey {
				br.AmbiguousByCopy = append(br.AmbiguousByCopy, t.key)
			}
			r.reached = r.reached || byCopy
		}
		if r.status != outbox.StatusDelivered && (stuck || r.reached) {
			br.Ambiguous[t.key] = r.connector
		}
		dj, _ := json.Marshal(d) // a map of strings always encodes
		auditIDs, details = append(auditIDs, r.id), append(details, string(dj))
	}
	if len(replayIDs) > 0 {
		// A relay may be claiming a later row of a replayed row's ordering key right now,
		// in a transaction begun while this row was still finished: wait for that claim to
		// commit, so that any claim that can see this row pending also sees the later row
		// in flight (claimSQL's "no later row of its key delivering").
		if _, err := tx.Exec(ctx, waitLaterClaimsSQL, replayIDs); err != nil {
			return fmt.Errorf("wait for claims of later rows: %w", err)
		}
		if _, err := tx.Exec(ctx, replaySQL, replayIDs, now); err != nil {
			return fmt.Errorf("put rows back: %w", err)
		}
	}
	// Rows the relay parked behind a replayed row (held: for an operator) go once it has.
	if err := unpark(ctx, tx, auditIDs, now); err != nil {
		return err
	}
	return audit(ctx, tx, ActionReplay, opts.Actor, opts.Reason, now, auditIDs, details)
}

// pastKeyWindow says why row r cannot be put back under its own key at now, when its
// receiver, which remembers keys for w.Window, would have forgotten the row's key by the
// end of an attempt started now: a relay would hold it again at once without sending it,
// and the replay, reported as done, would have done nothing but spend an attempt. It
// says what to do instead, which depends on what the row is now; it is empty when the
// window has not passed. of is the key of the row r copies when r is a copy that replay
// --new-key made: NewKey refuses a copy, and re-executes the row it copies instead.
func pastKeyWindow(r lockedRow, w KeyWindow, now time.Time, of string) string {
	if !connectors.KeyForgotten(w.Window, w.AttemptMax, r.firstAttemptAt, now) {
		return ""
	}
	why := fmt.Sprintf("past its key window: %s remembers idempotency keys for %s and the row's first attempt was at %s, "+
		"so a relay would hold it again without sending it (under the same key the receiver could act twice)",
		r.connector, w.Window, r.firstAttemptAt.UTC().Format(time.RFC3339))
	newKey := "replay it with NewKey (--new-key)"
	if of != "" {
		newKey = fmt.Sprintf("replay %q, the row this copy re-executes, with NewKey (--new-key)", of)
	}
	switch r.status {
	case outbox.StatusDelivered:
		if of != "" {
			return why + fmt.Sprintf("; to send it again, replay %q, the row this copy re-executes, with NewKey and "+
				"Redeliver (--new-key --redeliver)", of)
		}
		return why + "; to send it again, replay it with NewKey and Redeliver (--new-key --redeliver)"
	case outbox.StatusDelivering:
		// Stuck: NewKey and cancel refuse it too, until a relay puts it back (and holds it).
		return why + "; a relay with its connector will put it back and hold it: then check the receiver for what " +
			"its attempts did, and " + newKey + " to act, or cancel it"
	case outbox.StatusHeld:
		return why + "; check the receiver for what its attempts did, then " + newKey + " to act, or cancel it"
	}
	return why + "; check the receiver for what its attempts did, then " + newKey + " to act"
}

// replayNewKey enqueues the copy of r that re-executes it, r having had n copies so far
// (copiesMade). changed is false when the previous copy is still on its way; reason is
// set when r cannot be re-executed, including when the previous copy was delivered (or
// is gone) and redeliver is false.
func replayNewKey(ctx context.Context, tx pgx.Tx, r lockedRow, n int, redeliver bool) (newKey string, changed bool, reason string, err error) {
	if r.status == outbox.StatusDelivering {
		return "", false, "stuck in delivering: a relay will retry it under its own key; replay it without NewKey, or cancel it once it is back", nil
	}
	var (
		m                outbox.Message
		payload, headers []byte
	)
	if err := tx.QueryRow(ctx, copySQL, r.id).Scan(&m.Connector, &payload, &m.OrderingKey, &headers,
		&m.CreatedBy); err != nil {
		return "", false, "", fmt.Errorf("read row %d: %w", r.id, err)
	}
	// Read as the relay reads them, so a value plain SQL wrote as a number is copied as
	// the text it was sent as; names are copied lowercase, as Enqueue takes them, since
	// plain SQL writes them as it likes (Traceparent) and the webhook connector sends
	// each by its canonical name whatever its case.
	m.Headers = make(map[string]string)
	for name, value := range outbox.DecodeHeaders(headers) {
		lower := strings.ToLower(name)
		if _, dup := m.Headers[lower]; dup {
			return "", false, fmt.Sprintf("its headers name %q twice, in different case, which the connector refuses to send; "+
				"enqueue a new intent with one of them to act after all", lower), nil
		}
		m.Headers[lower] = value
	}
	if r.status == outbox.StatusHeld && m.OrderingKey != "" {
		return "", false, "held with an ordering key, which would hold its copy back; cancel it, then enqueue a new intent under a new key to act after all", nil
	}
	prev, st, reason, err := lastCopy(ctx, tx, r.key, n, redeliver)
	if err != nil || reason != "" {
		return "", false, reason, err
	}
	switch st {
	case outbox.StatusPending, outbox.StatusDelivering, outbox.StatusHeld, outbox.StatusAwaitingApproval:
		return prev, false, "", nil
	}
	m.Key = outbox.Key(r.key, "replay", strconv.Itoa(n+1))
	m.Payload = json.RawMessage(payload)
	if _, err := outbox.Enqueue(ctx, tx, m); err != nil {
		if errors.Is(err, outbox.ErrInvalidMessage) {
			// A row plain SQL wrote may hold what Enqueue refuses (a header name with
			// '_'): that row cannot be copied, which need not fail the others' replay.
			// Enqueue refuses before writing, so the transaction goes on.
			return "", false, fmt.Sprintf("its copy cannot be enqueued: %v", err), nil
		}
		return "", false, "", err
	}
	return m.Key, true, "", nil
}

// lastCopy looks at prev, the latest of the n copies that replay --new-key made of the
// row with key (none when n is 0), and returns its status ("" when gone or none); reason
// is set when it was delivered, or is gone, and redeliver is false: the operation
// happened, and executing it again needs Redeliver, as replaying a delivered row does.
func lastCopy(ctx context.Context, tx pgx.Tx, key string, n int, redeliver bool) (prev, status, reason string, err error) {
	if n == 0 {
		return "", "", "", nil
	}
	prev = outbox.Key(key, "replay", strconv.Itoa(n))
	st, refused, err := operationStatus(ctx, tx, prev)
	if err != nil {
		return "", "", "", err
	}
	if refused != "" {
		return prev, "", refused, nil
	}
	switch st {
	case outbox.StatusDelivered, "":
		// The row itself stays dead or held, so a replay --new-key run again (for the
		// rows that died since) selects it again: a further copy would have the
		// receiver act again for an operation that happened, as replaying a
		// delivered row would. A copy that is gone was delivered or canceled, then
		// deleted by retention or purge, which keep no other rows.
		if redeliver {
			break
		}
		if st == "" {
			return prev, st, fmt.Sprintf("its copy %s is gone (retention or purge deletes only delivered and canceled rows), "+
				"so it may have been executed already; executing it once more needs Redeliver (--redeliver)", prev), nil
		}
		return prev, st, fmt.Sprintf("its copy %s was delivered; executing it once more needs Redeliver (--redeliver)", prev), nil
	}
	return prev, st, "", nil
}

// copiesMadeSQL counts the new-key replays each of the rows $1 has had, for those that
// had any.
const copiesMadeSQL = `
SELECT a.outbox_id, count(*) FROM outbox_audit a
WHERE a.outbox_id = ANY($1::bigint[]) AND a.action = 'replay' AND a.details->>'new_key' IS NOT NULL
GROUP BY a.outbox_id`

// copiesMade maps the rows of b that replay --new-key copied to how many copies it made,
// once a batch: the rows of most replays have none, and neither their copies nor the
// attempts of copies need looking up, row by row.
func copiesMade(ctx context.Context, tx pgx.Tx, b []target) (map[int64]int, error) {
	rows, err := tx.Query(ctx, copiesMadeSQL, ids(b))
	if err != nil {
		return nil, fmt.Errorf("look up copies: %w", err)
	}
	defer rows.Close()
	out := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("look up copies: %w", err)
		}
		out[id] = n
	}
	return out, rows.Err()
}

// otherReachedSQL says whether an attempt of another row of the operation than the row
// with key $2 may have reached the receiver, as lockSQL's last column says of a row's
// own: of the row with key $1 (the row $2 is a copy of, or $2 itself) and of the copies
// that replay --new-key made of it. The keys are joined to the rows, each found by its
// key's index: "key = $1 OR key IN (...)" would read the whole table for every row.
const otherReachedSQL = `
SELECT EXISTS (
    SELECT 1
    FROM (SELECT $1::text AS key
          UNION ALL
          SELECT a.details->>'new_key' FROM outbox_audit a JOIN outbox o ON o.id = a.outbox_id
          WHERE o.idempotency_key = $1 AND a.action = 'replay') k
    JOIN outbox c ON c.idempotency_key = k.key
    WHERE c.idempotency_key <> $2
      AND (c.ambiguous OR EXISTS (SELECT 1 FROM outbox_attempts t
                                  WHERE t.outbox_id = c.id AND (t.ambiguous OR t.outcome = 'delivered'))))`

// otherReached says whether an attempt of another row than key of the operation of the
// row with key of (otherReachedSQL) may have reached the receiver.
func otherReached(ctx context.Context, tx pgx.Tx, of, key string) (bool, error) {
	var reached bool
	if err := tx.QueryRow(ctx, otherReachedSQL, of, key).Scan(&reached); err != nil {
		return false, fmt.Errorf("look up the attempts of copies of %q: %w", of, err)
	}
	return reached, nil
}

// laterCopy says why key, a copy that replay --new-key made of the row with key of,
// cannot be put back under its own key: a later copy of that row re-executes the
// operation, or that row itself is on its way. It is empty when key is the latest copy
// and the row is not.
func laterCopy(ctx context.Context, tx pgx.Tx, key, of string) (string, error) {
	latest, err := LatestCopy(ctx, tx, of)
	if err != nil {
		return "", err
	}
	if latest == key {
		// The row of is pending or delivering only once it was put back under its own
		// key after its copies were made (a new-key replay leaves a pending row unchanged,
		// and refuses one delivering): with Redeliver, after this copy was delivered. It
		// is then on its way, as replayCopied refuses the row while its copy is.
		st, refused, err := operationStatus(ctx, tx, of)
		if err != nil || refused != "" {
			return refused, err
		}
		if st == outbox.StatusPending || st == outbox.StatusDelivering {
			return fmt.Sprintf("%q, the row this copy that replay --new-key made copies, was put back under its own key "+
				"and is on its way: putting the copy back too would execute the operation twice", of), nil
		}
		return "", nil
	}
	st, refused, err := operationStatus(ctx, tx, latest)
	if err != nil || refused != "" {
		return refused, err
	}
	if st == outbox.StatusCanceled {
		// Replaying a canceled copy is refused; the row it copies, which a canceled copy
		// no longer holds back (replayCopied), is the operation's current row.
		return fmt.Sprintf("a later copy %s that replay --new-key made of %q was canceled: replay %q instead, "+
			"so that the operation runs once more, not twice", latest, of, of), nil
	}
	return fmt.Sprintf("a later copy %s that replay --new-key made of %q re-executes the operation: "+
		"replay that one instead, so that the operation runs once more, not twice", latest, of), nil
}

// replayCopied says why row r, of which replay --new-key made n copies, cannot be
// put back under its own key: its latest copy is still on its way (the operation would
// run twice at once), or was delivered or is gone and redeliver is false (see
// lastCopy), or is dead. A dead copy is the operation's current row, which a replay
// puts back under its own key (replay --status dead selects the row and its copy
// together, and would put both back: the operation would run twice). It is empty when
// the row has no copy, or its latest copy was canceled.
func replayCopied(ctx context.Context, tx pgx.Tx, r lockedRow, n int, redeliver bool) (string, error) {
	prev, st, reason, err := lastCopy(ctx, tx, r.key, n, redeliver)
	switch st {
	case outbox.StatusDelivering:
		// Cancel refuses a row in flight (or stuck): its outcome decides first.
		reason = fmt.Sprintf("its copy %s, which replay --new-key made, is being delivered: putting the row back too "+
			"would execute the operation twice; wait for the copy's outcome", prev)
	case outbox.StatusPending, outbox.StatusHeld, outbox.StatusAwaitingApproval:
		reason = fmt.Sprintf("its copy %s, which replay --new-key made, is still on its way: putting the row back too "+
			"would execute the operation twice; cancel the copy first to replay the row instead", prev)
	case outbox.StatusDead:
		reason = fmt.Sprintf("its copy %s, which replay --new-key made, is dead: replay the copy instead, "+
			"so that the operation runs once more, not twice", prev)
	}
	return reason, err
}

// resolve turns a selection into rows, in order, and the keys no row has.
func resolve(ctx context.Context, db outbox.DB, sel Selection, now time.Time) ([]target, []string, error) {
	switch {
	case sel.Filter != nil && len(sel.Keys) > 0:
		return nil, nil, fmt.Errorf("%w: select by Keys or by Filter, not both", ErrInvalidFilter)
	case sel.Filter == nil && len(sel.Keys) == 0:
		return nil, nil, fmt.Errorf("%w: the selection is empty: give Keys or a Filter", ErrInvalidFilter)
	case sel.Filter == nil:
		return resolveKeys(ctx, db, sel.Keys)
	}
	f := *sel.Filter
	if f.Limit < 0 {
		return nil, nil, fmt.Errorf("%w: Limit: %d is negative", ErrInvalidFilter, f.Limit)
	}
	f.Now, f.After = cmp.Or(f.Now, now), "" // one clock for every page: the replay's
	capped := f.Limit
	var out []target
	for {
		f.Limit = MaxListLimit
		if capped > 0 {
			f.Limit = min(MaxListLimit, capped-len(out))
		}
		page, err := List(ctx, db, f)
		if err != nil {
			return nil, nil, err
		}
		for _, in := range page.Intents {
			out = append(out, target{id: in.ID, key: in.Key})
		}
		if page.Next == "" || (capped > 0 && len(out) >= capped) {
			return out, nil, nil
		}
		f.After = page.Next
	}
}

// ErrReplayStopped is returned by [Replay] when [ReplayOptions.Stop] ended it between
// batches; the result holds what the batches before committed.
var ErrReplayStopped = errors.New("replay stopped")

func sleepUntil(ctx context.Context, stop <-chan struct{}, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-stop:
		return ErrReplayStopped
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return nil
	}
}

// GuaranteeNote says in plain words what sending a row again means for duplicates under
// a connector's guarantee, for replay's confirmation prompt.
func GuaranteeNote(g connectors.Guarantee) string {
	switch g {
	case connectors.Enforced:
		return "enforced: the receiver dedupes on the key, so within its key window it returns its stored answer for the same key and acts only once; " +
			"after the window has passed it would act again, so where the connector declares the window (payment, email over Resend: 24 hours from the row's first attempt) " +
			"the relay holds such a row instead of sending it, and only a replay with a new key re-executes it"
	case connectors.Reconciled:
		return "reconciled: the receiver does not dedupe, but the connector looks for the key's effect first and records a found one as delivered instead of acting again"
	case connectors.Forwarded:
		return "forwarded: the key travels with the request but nothing is known to enforce it, so the receiver may act twice"
	default:
		return fmt.Sprintf("unknown guarantee %q: assume the receiver may act twice", string(g))
	}
}
