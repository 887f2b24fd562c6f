package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// The statement that says this relay polls fast commits, and the connection drops before
// its reply arrives. Inserts of its instances then send no NOTIFY for the next
// fastPollWindow, so the relay must poll fast for it as the database says: it used to
// take the error as "not written" and poll only every PollInterval, and a row inserted
// meanwhile waited that long (here an hour). So in every query exec mode: in the simple
// protocol (as behind a transaction pooler) pgx reports the lost reply as "conn closed",
// which it calls safe to retry.
func TestLostPollFastReplyStillPollsFast(t *testing.T) {
	t.Parallel()
	for _, mode := range append([]pgx.QueryExecMode{pgx.QueryExecModeCacheStatement}, pgtest.ExecModes...) {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			testLostPollFastReply(t, mode)
		})
	}
}

func testLostPollFastReply(t *testing.T, mode pgx.QueryExecMode) {
	direct, proxy, cfg, _ := lossySetup(t)
	cfg.PollInterval = time.Hour
	conn := &recordingConnector{}
	proxy.arm("relay_id, polling_until)", nil) // pollFastSQL
	r, err := New(pgtest.InMode(t, proxy.pool, mode), cfg, map[string]Instance{"webhook": {Connector: conn}})
	require.NoError(t, err)
	r.fastGrace = waitTimeout // the lost reply and the insert below may be far apart on a busy machine
	run(t, r)

	enqueue(t, direct, "first", "webhook", map[string]int{"n": 1})
	waitKilled(t, proxy)
	waitStatus(t, direct, "first", outbox.StatusDelivered) // its outcome's round is over
	var marked bool
	require.NoError(t, direct.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM outbox_wake_connectors
		WHERE connector = 'webhook' AND relay_id = $1 AND polling_until > '-infinity')`, r.ID()).Scan(&marked))
	require.True(t, marked, "the lost statement committed")
	// The mark stands in the database for fastPollWindow, renewed here in the insert's own
	// transaction as the lost statement wrote it: this insert sends no NOTIFY, however
	// long this test took to get here.
	tx, err := direct.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = tx.Exec(t.Context(), `UPDATE outbox_wake_connectors SET polling_until = clock_timestamp() + interval '2 seconds'
		WHERE connector = 'webhook' AND relay_id = $1`, r.ID())
	require.NoError(t, err)
	enqueue(t, tx, "second", "webhook", map[string]int{"n": 2})
	require.NoError(t, tx.Commit(t.Context()))
	waitStatus(t, direct, "second", outbox.StatusDelivered)
}

// The statement that says this relay polls fast gets no answer (the network between relay
// and database hangs, with no reset: the kernel retransmits for minutes). It is a hint
// for the insert trigger, run by the claim loop between rounds, and it waited without a
// bound: the loop wrote no outcome and claimed no row until it ended, while the leases of
// the rows it had sent ran out (a round is bounded by roundTimeout). Here the first row's
// outcome, waiting behind it, must still be written, and the second row sent.
func TestHungPollFastStatementDoesNotStopTheClaimLoop(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	conn := &recordingConnector{}
	held, _ := proxy.holdOnce(t, "SET polling_until = excluded.polling_until") // pollFastSQL
	start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})

	enqueue(t, direct, "first", "webhook", map[string]int{"n": 1})
	waitFor(t, held, "the relay never said it polls fast")
	waitStatus(t, direct, "first", outbox.StatusDelivered)
	enqueue(t, direct, "second", "webhook", map[string]int{"n": 2})
	waitStatus(t, direct, "second", outbox.StatusDelivered)
}
