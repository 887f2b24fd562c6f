package ops_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

func replayOpts() ops.ReplayOptions {
	return ops.ReplayOptions{Actor: "alice", Reason: "receiver fixed", Now: base}
}

func TestReplay(t *testing.T) {
	t.Parallel()

	t.Run("dead to pending with audit, twice is idempotent", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		insertRow(t, pool, row{Key: "d1", Status: outbox.StatusDead, Attempts: 5, LastError: "500", Age: time.Hour, Ambiguous: true})
		insertRow(t, pool, row{Key: "h1", Status: outbox.StatusHeld, Attempts: 1, Age: time.Hour})
		var progress [][2]int
		opts := replayOpts()
		opts.BatchSize = 1
		opts.Rate = 1e6
		opts.ProgressFunc = func(done, total int) { progress = append(progress, [2]int{done, total}) }

		res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"d1", "h1", "d1", "missing"}}, opts)
		require.NoError(t, err)
		require.Equal(t, []string{"d1", "h1"}, res.Replayed)
		require.Empty(t, res.Unchanged)
		require.Empty(t, res.Refused)
		require.Equal(t, []string{"missing"}, res.NotFound)
		require.Equal(t, [][2]int{{1, 2}, {2, 2}}, progress)

		s := state(t, pool, "d1")
		require.Equal(t, outbox.StatusPending, s.Status)
		require.True(t, s.Ambiguous, "kept: a late outcome of its ambiguous attempt is still recorded")
		require.Equal(t, 5, s.Attempts)
		require.Equal(t, "500", *s.LastError)
		require.True(t, s.NextAt.Equal(base))
		require.Equal(t, [][3]string{{"replay", "alice", `{"from_status": "dead"}`}}, auditRows(t, pool, "d1"))
		require.Equal(t, [][3]string{{"replay", "alice", `{"from_status": "held"}`}}, auditRows(t, pool, "h1"))

		res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"d1", "h1"}}, replayOpts())
		require.NoError(t, err)
		require.Empty(t, res.Replayed)
		require.Equal(t, []string{"d1", "h1"}, res.Unchanged)
		require.Len(t, auditRows(t, pool, "d1"), 1)
	})

	t.Run("leases: live refused, expired replayed as ambiguous", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		insertRow(t, pool, row{Key: "live", Status: outbox.StatusDelivering, LeaseIn: time.Minute, Attempts: 1})
		insertRow(t, pool, row{Key: "stuck", Status: outbox.StatusDelivering, LeaseIn: -time.Minute, Attempts: 2, LeaseOwner: "relay-dead", Age: 5 * time.Minute})

		res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"live", "stuck"}}, replayOpts())
		require.NoError(t, err)
		require.Equal(t, []string{"stuck"}, res.Replayed)
		require.Contains(t, res.Refused["live"], "in flight")
		require.Equal(t, outbox.StatusDelivering, state(t, pool, "live").Status)

		s := state(t, pool, "stuck")
		require.Equal(t, outbox.StatusPending, s.Status)
		require.True(t, s.Ambiguous)
		require.Nil(t, s.LeaseOwner)
		d, err := ops.Inspect(t.Context(), pool, "stuck")
		require.NoError(t, err)
		require.Len(t, d.Attempts, 1)
		require.Equal(t, "lease_expired", d.Attempts[0].Outcome)
		require.Equal(t, "relay-dead", d.Attempts[0].Relay)
		require.Equal(t, 2, d.Attempts[0].Attempt)
		require.True(t, d.Attempts[0].Ambiguous)
	})

	t.Run("dry run changes nothing", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		insertRow(t, pool, row{Key: "d1", Status: outbox.StatusDead})
		insertRow(t, pool, row{Key: "p1", Status: outbox.StatusPending})
		insertRow(t, pool, row{Key: "c1", Status: outbox.StatusCanceled})
		opts := replayOpts()
		opts.DryRun = true
		res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"d1", "p1", "c1"}}, opts)
		require.NoError(t, err)
		require.True(t, res.DryRun)
		require.Equal(t, []string{"d1"}, res.Replayed)
		require.Equal(t, []string{"p1"}, res.Unchanged)
		require.Contains(t, res.Refused, "c1")
		require.Equal(t, outbox.StatusDead, state(t, pool, "d1").Status)
		require.Zero(t, count(t, pool, `SELECT count(*) FROM outbox_audit`))

		opts.NewKey = true
		res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"d1"}}, opts)
		require.NoError(t, err)
		require.Equal(t, []string{"d1"}, res.Replayed)
		require.Equal(t, 3, count(t, pool, `SELECT count(*) FROM outbox`))
	})

	t.Run("statuses and redeliver", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		insertRow(t, pool, row{Key: "dl", Status: outbox.StatusDelivered, Attempts: 1})
		insertRow(t, pool, row{Key: "c1", Status: outbox.StatusCanceled})
		insertRow(t, pool, row{Key: "aa", Status: outbox.StatusAwaitingApproval})

		res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"dl", "c1", "aa"}}, replayOpts())
		require.NoError(t, err)
		require.Empty(t, res.Replayed)
		require.Contains(t, res.Refused["dl"], "Redeliver")
		require.Contains(t, res.Refused["c1"], "canceled")
		require.Contains(t, res.Refused["aa"], "approv")

		opts := replayOpts()
		opts.Redeliver = true
		res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"dl", "c1"}}, opts)
		require.NoError(t, err)
		require.Equal(t, []string{"dl"}, res.Replayed)
		require.Contains(t, res.Refused, "c1")
		s := state(t, pool, "dl")
		require.Equal(t, outbox.StatusPending, s.Status)
		require.NotNil(t, s.Result, "the stored answer is kept until the next one")
		require.Equal(t, outbox.StatusCanceled, state(t, pool, "c1").Status)
		require.Equal(t, [][3]string{{"replay", "alice", `{"from_status": "delivered"}`}}, auditRows(t, pool, "dl"))
	})

	t.Run("by filter", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		for i := range 7 {
			insertRow(t, pool, row{Key: fmt.Sprintf("dead-%d", i), Status: outbox.StatusDead, Connector: "email", Age: time.Duration(i) * time.Minute})
		}
		insertRow(t, pool, row{Key: "other", Status: outbox.StatusDead, Connector: "slack"})
		opts := replayOpts()
		opts.BatchSize = 3
		res, err := ops.Replay(t.Context(), pool, ops.Selection{Filter: &ops.Filter{Status: []string{"dead"}, Connector: "email", Now: base}}, opts)
		require.NoError(t, err)
		require.Len(t, res.Replayed, 7)
		require.Equal(t, outbox.StatusDead, state(t, pool, "other").Status)
		require.Equal(t, 7, count(t, pool, `SELECT count(*) FROM outbox WHERE status = 'pending'`))

		_, err = ops.Replay(t.Context(), pool, ops.Selection{Filter: &ops.Filter{Status: []string{"bogus"}}}, opts)
		require.ErrorIs(t, err, ops.ErrInvalidFilter)
		_, err = ops.Replay(t.Context(), pool, ops.Selection{}, opts)
		require.ErrorIs(t, err, ops.ErrInvalidFilter)
		_, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"other"}}, ops.ReplayOptions{})
		require.ErrorIs(t, err, ops.ErrInvalidOptions)
	})

	t.Run("new key", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		insertRow(t, pool, row{Key: "old", Status: outbox.StatusDead, Connector: "webhook:crm", OrderingKey: "cust-1",
			Payload: `{"amount": 5}`, Attempts: 3})
		opts := replayOpts()
		opts.NewKey = true
		res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"old"}}, opts)
		require.NoError(t, err)
		want := outbox.Key("old", "replay", "1")
		require.Equal(t, []string{"old"}, res.Replayed)
		require.Equal(t, map[string]string{"old": want}, res.NewKeys)

		require.Equal(t, outbox.StatusDead, state(t, pool, "old").Status, "the old row stays as it is")
		in, err := outbox.Get(t.Context(), pool, want)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, in.Status)
		require.Equal(t, "webhook:crm", in.Connector)
		require.Equal(t, "cust-1", in.OrderingKey)
		require.JSONEq(t, `{"amount": 5}`, string(in.Payload))
		require.Zero(t, in.Attempts)
		audit := auditRows(t, pool, "old")
		require.Len(t, audit, 1)
		require.JSONEq(t, `{"from_status": "dead", "new_key": "`+want+`"}`, audit[0][2])

		// Again while the copy is on its way: unchanged.
		res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"old"}}, opts)
		require.NoError(t, err)
		require.Equal(t, []string{"old"}, res.Unchanged)
		require.Equal(t, want, res.NewKeys["old"])
		require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM outbox`))

		// Once the copy died too, a new replay makes a second copy.
		_, err = pool.Exec(t.Context(), `UPDATE outbox SET status = 'dead' WHERE idempotency_key = $1`, want)
		require.NoError(t, err)
		res, err = ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"old"}}, opts)
		require.NoError(t, err)
		require.Equal(t, outbox.Key("old", "replay", strconv.Itoa(2)), res.NewKeys["old"])
		require.Equal(t, 3, count(t, pool, `SELECT count(*) FROM outbox`))
	})

	t.Run("purged payload refused", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		insertRow(t, pool, row{Key: "dl", Status: outbox.StatusDelivered, Age: 48 * time.Hour})
		_, err := ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true, Now: base})
		require.NoError(t, err)
		opts := replayOpts()
		opts.Redeliver = true
		res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"dl"}}, opts)
		require.NoError(t, err)
		require.Contains(t, res.Refused["dl"], "purged")
		require.Equal(t, outbox.StatusDelivered, state(t, pool, "dl").Status)
	})
}

// TestReplayRaceWithRelay has a "relay" transaction lock a row and record it delivered,
// as recordSQL does, while Replay runs: Replay must not overwrite the relay's outcome.
func TestReplayRaceWithRelay(t *testing.T) {
	t.Parallel()
	for _, leaseIn := range []time.Duration{time.Minute, -time.Minute} {
		t.Run("lease "+leaseIn.String(), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			insertRow(t, pool, row{Key: "race", Status: outbox.StatusDelivering, LeaseIn: leaseIn, Attempts: 1})

			relay, err := pool.Begin(t.Context())
			require.NoError(t, err)
			defer relay.Rollback(t.Context()) //nolint:errcheck // committed below
			_, err = relay.Exec(t.Context(), `SELECT 1 FROM outbox WHERE idempotency_key = 'race' FOR UPDATE`)
			require.NoError(t, err)
			_, err = relay.Exec(t.Context(), `
UPDATE outbox SET status = 'delivered', result = '{"status": 200}', lease_owner = NULL,
       lease_expires_at = NULL, delivered_at = $1, updated_at = $1
WHERE idempotency_key = 'race' AND status = 'delivering' AND lease_owner = 'relay-1'`, base)
			require.NoError(t, err)

			type out struct {
				res ops.ReplayResult
				err error
			}
			done := make(chan out, 1)
			go func() {
				res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"race"}}, replayOpts())
				done <- out{res, err}
			}()
			o := <-done // SKIP LOCKED: Replay does not wait for the relay
			require.NoError(t, o.err)
			require.Empty(t, o.res.Replayed)
			require.Contains(t, o.res.Refused, "race")

			cres, err := ops.Cancel(t.Context(), pool, []string{"race"}, "bob", "", base)
			require.NoError(t, err)
			require.Contains(t, cres.Refused, "race")

			require.NoError(t, relay.Commit(t.Context()))
			s := state(t, pool, "race")
			require.Equal(t, outbox.StatusDelivered, s.Status)
			require.JSONEq(t, `{"status": 200}`, *s.Result)
			require.Zero(t, count(t, pool, `SELECT count(*) FROM outbox_audit`))

			// After the relay committed, replay sees a delivered row.
			res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"race"}}, replayOpts())
			require.NoError(t, err)
			require.Contains(t, res.Refused["race"], "delivered")
		})
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	for _, st := range ops.Statuses {
		insertRow(t, pool, row{Key: st, Status: st, LeaseIn: time.Minute})
	}
	res, err := ops.Cancel(t.Context(), pool, []string{"pending", "held", "awaiting_approval", "canceled",
		"delivering", "delivered", "dead", "nope"}, "alice", "not needed", base)
	require.NoError(t, err)
	require.Equal(t, []string{"pending", "held", "awaiting_approval"}, res.Canceled)
	require.Equal(t, []string{"canceled"}, res.Unchanged)
	require.Equal(t, []string{"nope"}, res.NotFound)
	require.Len(t, res.Refused, 3)
	for _, k := range []string{"delivering", "delivered", "dead"} {
		require.Contains(t, res.Refused, k)
		require.Equal(t, k, state(t, pool, k).Status)
	}
	for _, k := range res.Canceled {
		require.Equal(t, outbox.StatusCanceled, state(t, pool, k).Status)
		require.Equal(t, [][3]string{{"cancel", "alice", `{"from_status": "` + k + `"}`}}, auditRows(t, pool, k))
	}

	res, err = ops.Cancel(t.Context(), pool, []string{"pending"}, "alice", "", base)
	require.NoError(t, err)
	require.Equal(t, []string{"pending"}, res.Unchanged)
	require.Len(t, auditRows(t, pool, "pending"), 1)

	_, err = ops.Cancel(t.Context(), pool, []string{"held"}, "", "", base)
	require.ErrorIs(t, err, ops.ErrInvalidOptions)
}

// CancelWhere leaves a row whose connector allow refuses as it is, listed as not found,
// with no audit row, and cancels the others of the same call.
func TestCancelWhereLeavesRowsOutsideAllowAlone(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "w", Connector: "webhook", Status: outbox.StatusPending})
	insertRow(t, pool, row{Key: "p", Connector: "payment", Status: outbox.StatusAwaitingApproval})
	var asked []string
	res, err := ops.CancelWhere(t.Context(), pool, []string{"w", "p"}, "alice", "", base, func(connector string) bool {
		asked = append(asked, connector)
		return connector == "webhook"
	})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"webhook", "payment"}, asked)
	require.Equal(t, []string{"w"}, res.Canceled)
	require.Equal(t, []string{"p"}, res.NotFound)
	require.Empty(t, res.Refused)
	require.Equal(t, outbox.StatusCanceled, state(t, pool, "w").Status)
	require.Equal(t, outbox.StatusAwaitingApproval, state(t, pool, "p").Status)
	require.Empty(t, auditRows(t, pool, "p"))
}

func TestPurge(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) *pgxpool.Pool {
		t.Helper()
		pool := pgtest.DB(t)
		for i := range 5 {
			insertRow(t, pool, row{Key: fmt.Sprintf("old-dl-%d", i), Status: outbox.StatusDelivered, Age: 48 * time.Hour})
		}
		insertRow(t, pool, row{Key: "old-c", Status: outbox.StatusCanceled, Age: 48 * time.Hour})
		insertRow(t, pool, row{Key: "new-dl", Status: outbox.StatusDelivered, Age: time.Hour})
		// Non-terminal rows, however old, are never touched.
		for _, st := range []string{outbox.StatusPending, outbox.StatusDelivering, outbox.StatusDead,
			outbox.StatusAwaitingApproval, outbox.StatusHeld} {
			insertRow(t, pool, row{Key: "old-" + st, Status: st, Age: 48 * time.Hour, LeaseIn: time.Minute})
		}
		return pool
	}

	t.Run("delete", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		res, err := ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{DryRun: true, Now: base})
		require.NoError(t, err)
		require.Equal(t, ops.PurgeResult{Rows: 6, DryRun: true}, res)
		require.Equal(t, 12, count(t, pool, `SELECT count(*) FROM outbox`))

		res, err = ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{BatchSize: 4, Now: base})
		require.NoError(t, err)
		require.Equal(t, 6, res.Rows)
		require.Equal(t, 6, count(t, pool, `SELECT count(*) FROM outbox`))
		require.Equal(t, 5, count(t, pool, `SELECT count(*) FROM outbox WHERE idempotency_key LIKE 'old-%'`))
		require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM outbox WHERE idempotency_key = 'new-dl'`))

		res, err = ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{Now: base})
		require.NoError(t, err)
		require.Zero(t, res.Rows)
	})

	t.Run("payload only", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		before := state(t, pool, "old-dl-0")
		res, err := ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true, DryRun: true, Now: base})
		require.NoError(t, err)
		require.Equal(t, 6, res.Rows)

		res, err = ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true, BatchSize: 2, Now: base, Actor: "retention"})
		require.NoError(t, err)
		require.Equal(t, 6, res.Rows)
		after := state(t, pool, "old-dl-0")
		require.Equal(t, "{}", after.Payload)
		require.Equal(t, before.Status, after.Status)
		require.Equal(t, before.Result, after.Result)
		require.Equal(t, [][3]string{{"purge_payload", "retention", "{}"}}, auditRows(t, pool, "old-dl-0"))
		require.Equal(t, 12, count(t, pool, `SELECT count(*) FROM outbox`))
		require.NotEqual(t, "{}", state(t, pool, "new-dl").Payload)
		for _, st := range []string{"pending", "delivering", "dead", "awaiting_approval", "held"} {
			s := state(t, pool, "old-"+st)
			require.Equal(t, st, s.Status)
			require.NotEqual(t, "{}", s.Payload)
		}

		res, err = ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true, Now: base})
		require.NoError(t, err)
		require.Zero(t, res.Rows, "a second run has nothing left to purge")
	})
}

func TestGuaranteeNote(t *testing.T) {
	t.Parallel()
	require.Contains(t, ops.GuaranteeNote(connectors.Enforced), "stored answer")
	require.Contains(t, ops.GuaranteeNote(connectors.Reconciled), "looks")
	require.Contains(t, ops.GuaranteeNote(connectors.Forwarded), "act twice")
	require.Contains(t, ops.GuaranteeNote("other"), "act twice")
}

func TestApproveReject(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "a1", Status: outbox.StatusAwaitingApproval, NextAttemptIn: time.Hour})
	insertRow(t, pool, row{Key: "a2", Status: outbox.StatusAwaitingApproval})
	insertRow(t, pool, row{Key: "c1", Status: outbox.StatusCanceled})
	insertRow(t, pool, row{Key: "d1", Status: outbox.StatusDelivered})

	in, err := ops.Approve(t.Context(), pool, "a1", "alice", "checked", base)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
	s := state(t, pool, "a1")
	require.Equal(t, outbox.StatusPending, s.Status)
	require.True(t, s.NextAt.Equal(base.Add(time.Hour)), "a not_before in the future still holds")
	require.Equal(t, [][3]string{{"approve", "alice", `{"from_status": "awaiting_approval"}`}}, auditRows(t, pool, "a1"))

	// Twice is harmless and writes no second audit row.
	in, err = ops.Approve(t.Context(), pool, "a1", "alice", "", base)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
	require.Len(t, auditRows(t, pool, "a1"), 1)
	_, err = ops.Reject(t.Context(), pool, "a1", "alice", "", base)
	require.ErrorIs(t, err, ops.ErrConflictState)

	in, err = ops.Reject(t.Context(), pool, "a2", "bob", "no", base)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusCanceled, in.Status)
	require.Equal(t, [][3]string{{"reject", "bob", `{"from_status": "awaiting_approval"}`}}, auditRows(t, pool, "a2"))
	_, err = ops.Reject(t.Context(), pool, "a2", "bob", "", base)
	require.NoError(t, err)
	require.Len(t, auditRows(t, pool, "a2"), 1)
	_, err = ops.Approve(t.Context(), pool, "a2", "bob", "", base)
	require.ErrorIs(t, err, ops.ErrConflictState)
	_, err = ops.Approve(t.Context(), pool, "c1", "bob", "", base)
	require.ErrorIs(t, err, ops.ErrConflictState)

	in, err = ops.Approve(t.Context(), pool, "d1", "bob", "", base)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, in.Status)

	_, err = ops.Approve(t.Context(), pool, "missing", "bob", "", base)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = ops.Reject(t.Context(), pool, "a1", "", "", base)
	require.ErrorIs(t, err, ops.ErrInvalidOptions)
}

func TestListConnectors(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "w", Connector: "webhook", Age: 3 * time.Minute})
	insertRow(t, pool, row{Key: "wc", Connector: "webhook:crm", Age: 2 * time.Minute})
	insertRow(t, pool, row{Key: "p", Connector: "payment", Age: time.Minute})
	keys := func(f ops.Filter) []string {
		page, err := ops.List(t.Context(), pool, f)
		require.NoError(t, err)
		var out []string
		for _, in := range page.Intents {
			out = append(out, in.Key)
		}
		return out
	}
	require.Equal(t, []string{"p", "wc", "w"}, keys(ops.Filter{}))
	require.Equal(t, []string{"wc", "w"}, keys(ops.Filter{Connectors: []string{"webhook:*"}}))
	require.Equal(t, []string{"p", "w"}, keys(ops.Filter{Connectors: []string{"webhook", "payment"}}))
	require.Empty(t, keys(ops.Filter{Connectors: []string{"slack"}}))
}

// purge --payload-only drops what was sent, the row's headers with its payload: they
// can hold personal data and the receiver's credentials (an Authorization header). A row
// whose payload is already empty but whose headers are not still has something to purge.
func TestPurgePayloadOnlyDropsHeaders(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	insertRow(t, pool, row{Key: "sent", Status: outbox.StatusDelivered, Age: 48 * time.Hour})
	insertRow(t, pool, row{Key: "empty", Status: outbox.StatusDelivered, Age: 48 * time.Hour})
	_, err := pool.Exec(t.Context(), `UPDATE outbox SET headers = '{"Authorization": "Bearer s3cret", "X-User": "alice@example.com"}'`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `UPDATE outbox SET payload = '{}' WHERE idempotency_key = 'empty'`)
	require.NoError(t, err)

	res, err := ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true, DryRun: true, Now: base})
	require.NoError(t, err)
	require.Equal(t, 2, res.Rows)
	res, err = ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true, Now: base})
	require.NoError(t, err)
	require.Equal(t, 2, res.Rows)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM outbox WHERE headers <> '{}' OR payload <> '{}'`))
	res, err = ops.Purge(t.Context(), pool, 24*time.Hour, ops.PurgeOptions{PayloadOnly: true, Now: base})
	require.NoError(t, err)
	require.Zero(t, res.Rows, "a second run has nothing left to purge")
}
