package relay

import (
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// pause stops the child with SIGSTOP: it holds its leases, connections and the answers
// that reach it meanwhile, and runs none of its timers until resume.
func (c *relayChild) pause(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = c.cmd.Process.Signal(syscall.SIGCONT) }) // so the cleanup's kill is not held up
}

// resume lets a paused child go on (SIGCONT).
func (c *relayChild) resume(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGCONT))
}

// lateState is what a late outcome must not change in a row another relay finished.
type lateState struct {
	Status, Result string
	Attempts       int
	Ambiguous      bool
	UpdatedAt      time.Time
	DeliveredAt    *time.Time
}

func lateStateOf(t *testing.T, pool *pgxpool.Pool, key string) lateState {
	t.Helper()
	var s lateState
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT status, coalesce(result::text, ''), attempts, ambiguous, updated_at, delivered_at
		FROM outbox WHERE idempotency_key = $1`, key).Scan(&s.Status, &s.Result, &s.Attempts, &s.Ambiguous, &s.UpdatedAt, &s.DeliveredAt))
	return s
}

// A relay process paused (SIGSTOP) past its lease, with the first row of an ordering key
// in flight: the receiver performed the write and answered while the process was
// stopped, so the answer waits in its socket. Another relay takes the row once the lease
// has expired, and the rows behind it; then the paused process resumes (SIGCONT), reads
// the answer, and writes its outcome late.
//
// Enforced: the other relay sent the row again with the same key (the receiver answered
// from its store), and delivered the rows behind it in their order. The resumed
// process's late delivery of the old attempt goes to the attempts log only: it leaves
// the newer state (attempts, result, times) as the other relay wrote it.
//
// Forwarded with the hold policy: the other relay held the row and sent nothing (the
// rows behind it wait). The resumed process's late delivery is the truth, recorded over
// the hold, and the key goes on: its next rows are delivered in order, each once.
func TestRelayPausedPastItsLeaseWritesItsOutcomeLate(t *testing.T) {
	t.Parallel()
	keys := []string{"paused/1", "paused/2", "paused/3"}
	for _, tt := range []struct {
		name string
		hold bool
	}{
		{"Enforced", false},
		{"ForwardedHeld", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			arrived, release, hold := holdEffect(keys[0])
			rcv, err := receiver.Start(receiver.Options{IgnoreKeys: tt.hold, OnEffect: func(e receiver.Effect) { hold(e.Key) }})
			require.NoError(t, err)
			t.Cleanup(rcv.Close)
			target, answered := answeredFront(t, rcv, keys[0])
			t.Cleanup(func() { closeOnce(release) })
			dsn, pool := childDB(t)
			var childEnv []string
			if tt.hold {
				childEnv = append(childEnv, childKindEnv+"="+childHold)
			}
			child := startRelayChild(t, dsn, target, childEnv...)

			msgs := make([]outbox.Message, len(keys))
			for i, k := range keys {
				msgs[i] = outbox.Message{Key: k, Connector: "webhook", Payload: map[string]int{"n": i}, OrderingKey: "account-7"}
			}
			_, err = outbox.EnqueueBatch(t.Context(), pool, msgs)
			require.NoError(t, err)
			waitFor(t, arrived, "the child relay never delivered the key's first row")
			child.pause(t)
			closeOnce(release)
			waitFor(t, answered, "the receiver never answered the paused relay's request")
			requireNothingRecorded(t, pool, keys[0])

			// Another relay, on a clock past the paused one's lease.
			guarantee, onAmbiguous := connectors.Enforced, ""
			if tt.hold {
				guarantee, onAmbiguous = connectors.Forwarded, AmbiguousHold
			}
			hook, err := webhook.New(webhook.Config{URL: target, Guarantee: guarantee})
			require.NoError(t, err)
			ahead := childLease + time.Hour
			_, stopOther := start(t, pool, &Config{ID: "successor", PollInterval: 50 * time.Millisecond, Lease: time.Minute,
				NowFunc: func() time.Time { return time.Now().Add(ahead) }, Registerer: prometheus.NewRegistry(), Logger: testLogger()},
				map[string]Instance{"webhook": {Connector: hook, OnAmbiguous: onAmbiguous}})
			lost := attemptRow{Attempt: 1, Outcome: "lease_expired", Ambiguous: true, Error: "lease expired before the outcome was recorded", RelayID: "child"}
			late := attemptRow{Attempt: 1, Outcome: "delivered", RelayID: "child"}
			if !tt.hold {
				for _, k := range keys {
					waitStatus(t, pool, k, outbox.StatusDelivered)
				}
			} else {
				waitStatus(t, pool, keys[0], outbox.StatusHeld)
			}
			// The other relay stops before the paused one resumes: on its clock, ahead, the
			// leases the resumed relay writes from now on would read as expired.
			stopOther()
			before := lateStateOf(t, pool, keys[0])

			child.resume(t)
			// Looked for without require, which may not fail the test from the condition's
			// goroutine: a failed read only makes the condition false.
			logged := func() bool {
				var n int
				err := pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_attempts a JOIN outbox o ON o.id = a.outbox_id
					WHERE o.idempotency_key = $1 AND a.relay_id = 'child' AND a.attempt = 1 AND a.outcome = 'delivered'`, keys[0]).Scan(&n)
				return err == nil && n > 0
			}
			if !assert.Eventually(t, logged, waitTimeout, 10*time.Millisecond, "the resumed relay logs its late attempt") {
				t.Fatalf("attempts of %s: %+v", keys[0], attemptsOf(t, pool, keys[0]))
			}
			if !tt.hold {
				require.Equal(t, []attemptRow{lost, {Attempt: 2, Outcome: "delivered", RelayID: "successor"}, late}, attemptsOf(t, pool, keys[0]))
				require.Equal(t, before, lateStateOf(t, pool, keys[0]), "the late outcome of an attempt the row has gone past changes nothing")
				require.Equal(t, 2, before.Attempts)
				require.Equal(t, 2, rcv.Requests(keys[0]), "sent again with the same key once")
			} else {
				for _, k := range keys {
					waitStatus(t, pool, k, outbox.StatusDelivered)
				}
				require.Equal(t, []attemptRow{lost, late}, attemptsOf(t, pool, keys[0]))
				after := lateStateOf(t, pool, keys[0])
				require.Equal(t, 1, after.Attempts)
				require.False(t, after.Ambiguous, "the receiver's answer to the attempt came: it acted")
				require.Equal(t, 1, rcv.Requests(keys[0]), "the held row was not sent again")
			}
			// One effect a row, in the key's order, each of the rows behind sent once.
			log := rcv.EffectLog()
			require.Len(t, log, len(keys))
			for i, k := range keys {
				require.Equal(t, k, log[i].Key, "effects in the key's order")
				require.Equal(t, 1, rcv.Effects(k), k)
			}
			for _, k := range keys[1:] {
				require.Equal(t, 1, rcv.Requests(k), k)
				att := attemptsOf(t, pool, k)
				require.Len(t, att, 1, k)
				require.Equal(t, "delivered", att[0].Outcome, k)
				require.False(t, att[0].Ambiguous, k)
			}
			child.stop(t)
		})
	}
}
