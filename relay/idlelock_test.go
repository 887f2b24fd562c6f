package relay

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// A relay's reclaim takes the rows of a relay that died (their leases expired) and then
// stands still in the middle of its transaction: its process paused (SIGSTOP, docker
// pause) or its network gone, here a request held by the proxy, the relay's own time
// limit on the work lengthened as a paused process's timers would be. The server must
// end that session within seconds, so that another relay puts the dead relay's rows back
// and sends them. Without a bound on the transaction's idle time the rows stayed locked,
// delivering under the dead relay's expired lease, for as long as the pause lasted (or,
// for a network gone without a reset, until the server's TCP keepalive gave up, hours):
// every other relay's reclaim and claim skipped them.
func TestReclaimStandingStillLetsGoOfTheDeadRelaysRows(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	keys := []string{"orphaned-1", "orphaned-2", "orphaned-3"}
	for i, k := range keys {
		enqueue(t, direct, k, "webhook", map[string]int{"n": i})
	}
	// Leased to a relay that died: in flight, the lease expired on every relay's clock.
	_, err := direct.Exec(t.Context(), `UPDATE outbox SET status = 'delivering', lease_owner = 'gone', lease_expires_at = now(),
		attempts = 1, first_attempt_at = now() WHERE idempotency_key = ANY($1)`, keys)
	require.NoError(t, err)

	// The stalled relay: its reclaim takes the rows (they are locked and put back, not yet
	// committed) and then stands still before its next statement (the savepoint of its
	// step that lets ordering keys go on).
	held, _ := proxy.holdOnce(t, "savepoint sp_")
	// Its claim loop goes on (only its reclaim stands still): it may send the rows too.
	mine := runStalled(t, proxy.pool, cfg)
	waitFor(t, held, "the stalled relay's reclaim never reached its second step")

	other := &recordingConnector{}
	otherCfg := *cfg
	otherCfg.ID = "other"
	start(t, direct, &otherCfg, map[string]Instance{"webhook": {Connector: other}})
	for _, k := range keys {
		in := waitStatus(t, direct, k, outbox.StatusDelivered)
		require.Equal(t, 2, in.Attempts, k)
		sent := slices.Concat(other.deliveries(k), mine.deliveries(k))
		require.Len(t, sent, 1, k)
		require.True(t, sent[0].PreviousAmbiguous, k)
		att := attemptsOf(t, direct, k)
		require.Len(t, att, 2, k)
		require.Equal(t, attemptRow{Attempt: 1, Outcome: "lease_expired", Ambiguous: true,
			Error: "lease expired before the outcome was recorded", RelayID: "gone"}, att[0], k)
		require.Equal(t, 2, att[1].Attempt, k)
		require.Equal(t, "delivered", att[1].Outcome, k)
	}
}

// A relay's pass that parks the rows behind a row held for an operator locks them and
// then stands still before it parks them (its process paused, its network gone; here
// its request held by the proxy). The server must end that session within seconds: once
// the operator has decided on the held row (canceled here), the row behind it is due,
// and another relay sends it. Without a bound on the transaction's idle time it stayed
// locked, and every relay's claim skipped it, for as long as the pause lasted.
func TestParkingStandingStillLetsGoOfTheRowsItLocked(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	_, err := outbox.EnqueueBatch(t.Context(), direct, []outbox.Message{
		{Key: "head", Connector: "webhook", Payload: []int{1}, OrderingKey: "account-9"},
		{Key: "behind", Connector: "webhook", Payload: []int{2}, OrderingKey: "account-9"},
	})
	require.NoError(t, err)
	_, err = direct.Exec(t.Context(), `UPDATE outbox SET status = 'held', attempts = 1, ambiguous = true WHERE idempotency_key = 'head'`)
	require.NoError(t, err)

	held, _ := proxy.holdOnce(t, "SET next_attempt_at = $6, last_error = p.why") // parkWaitingSQL
	// Its claim loop goes on (only its parking pass stands still): it may send the row too.
	mine := runStalled(t, proxy.pool, cfg)
	waitFor(t, held, "the stalled relay never parked the row behind the held one")

	// The operator decides: the held row is canceled, and the row behind it is due.
	_, err = direct.Exec(t.Context(), `UPDATE outbox SET status = 'canceled' WHERE idempotency_key = 'head'`)
	require.NoError(t, err)
	other := &recordingConnector{}
	otherCfg := *cfg
	otherCfg.ID = "other"
	start(t, direct, &otherCfg, map[string]Instance{"webhook": {Connector: other}})
	in := waitStatus(t, direct, "behind", outbox.StatusDelivered)
	require.Equal(t, 1, in.Attempts)
	require.Len(t, slices.Concat(other.deliveries("behind"), mine.deliveries("behind")), 1)
}

// runStalled runs the relay "stalled" on pool (the proxy's, whose requests a test holds)
// with cfg's clock, polling hourly, and returns what it sends. Its maintenance's time
// limit is long, as a paused process's timers do not run.
func runStalled(t *testing.T, pool *pgxpool.Pool, cfg *Config) *recordingConnector {
	t.Helper()
	mine := &recordingConnector{}
	stalled, err := New(pool, &Config{ID: "stalled", PollInterval: time.Hour, Registerer: prometheus.NewRegistry(),
		Logger: testLogger(), NowFunc: cfg.NowFunc}, map[string]Instance{"webhook": {Connector: mine}})
	require.NoError(t, err)
	stalled.maintainTimeout = 10 * waitTimeout
	run(t, stalled)
	return mine
}
