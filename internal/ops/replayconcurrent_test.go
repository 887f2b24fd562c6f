package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// Two replays at once, one of a row and one of the copy that replay --new-key made of
// it: each looked at the other row's status as last committed, which the other replay
// was changing, so both went ahead and the operation was executed twice more. (Selected
// together in one replay, one is refused.) Here: the row put back (--redeliver, its copy
// was delivered) and the copy put back, under their own keys; and the row copied again
// (--new-key, its copy dead) and that dead copy put back. The test holds the first replay
// at its audit entry, after it has decided and changed its row and before it commits, by
// holding a lock on outbox_audit that its insert waits for.
func TestConcurrentReplaysOfARowAndItsCopyExecuteTheOperationOnce(t *testing.T) {
	t.Parallel()
	type replay struct {
		copy   bool // the copy, else the row
		newKey bool
	}
	for _, tc := range []struct {
		name          string
		copyDelivered bool // else dead
		first, second replay
	}{
		{"redeliver: copy first", true, replay{copy: true}, replay{}},
		{"redeliver: row first", true, replay{}, replay{copy: true}},
		{"new key: copy first", false, replay{copy: true}, replay{newKey: true}},
		{"new key: row first", false, replay{newKey: true}, replay{copy: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, _, opts, first := copiedDeadRow(t)
			status := outbox.StatusDead
			if tc.copyDelivered {
				status = outbox.StatusDelivered
			}
			_, err := pool.Exec(t.Context(), `UPDATE outbox SET status = $2 WHERE idempotency_key = $1`, first, status)
			require.NoError(t, err)
			opts.Redeliver = tc.copyDelivered

			holder, err := pool.Begin(t.Context())
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(context.WithoutCancel(t.Context())) }()
			_, err = holder.Exec(t.Context(), `LOCK TABLE outbox_audit IN SHARE MODE`)
			require.NoError(t, err)
			waiting := func(n int) bool {
				return count(t, pool, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`) >= n
			}

			type replayed struct {
				key string
				res ops.ReplayResult
				err error
			}
			start := func(r replay) chan replayed {
				key := "charge"
				if r.copy {
					key = first
				}
				o := opts
				o.NewKey = r.newKey
				done := make(chan replayed, 1)
				go func() {
					res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{key}}, o)
					done <- replayed{key, res, err}
				}()
				return done
			}
			one := start(tc.first)
			require.Eventually(t, func() bool { return waiting(1) }, time.Minute, 10*time.Millisecond,
				"the first replay waits at its audit entry")
			two := start(tc.second)
			var second *replayed
			require.Eventually(t, func() bool {
				select {
				case got := <-two:
					second = &got
					return true
				default:
					return waiting(2)
				}
			}, time.Minute, 10*time.Millisecond)
			require.NoError(t, holder.Commit(t.Context()))
			if second == nil {
				got := <-two
				second = &got
			}
			firstRes := <-one
			require.NoError(t, firstRes.err)
			require.NoError(t, second.err)
			require.Equal(t, []string{firstRes.key}, firstRes.res.Replayed, "%+v", firstRes.res)
			require.Empty(t, second.res.Replayed, "%+v", second.res)
			require.NotEmpty(t, second.res.Refused[second.key])
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM outbox WHERE status = 'pending'`),
				"the operation was executed more than once more")
		})
	}
}
