package relay

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// Rows that plain SQL wrote and that the claim cannot take for their data: an attempts
// count at the integer maximum (the claim's attempts + 1 is out of range), and headers
// of numbers written out in full (1e131071, stored in a few bytes, is 131,072 characters
// of text), more than PostgreSQL's 1 GB limit on text. Either failed every claim of its
// connector, for good: no row of it was delivered by any relay again. They go to dead
// with a reason an operator can act on, their attempts untouched and no attempt logged,
// and every other row is delivered, the next row of a buried row's ordering key too.
func TestUnclaimableRowsGoDeadAndTheOthersAreDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, attempts, ordering_key)
		VALUES ('before', 'webhook', '{}', 0, NULL),
		       ('at-max', 'webhook', '{}', 2147483647, 'k'),
		       ('after-at-max', 'webhook', '{}', 0, 'k')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, headers)
		SELECT 'huge-numbers', 'webhook', '{}', jsonb_build_object('x-n', jsonb_agg('1e131071'::numeric))
		FROM generate_series(1, 8200)`)
	require.NoError(t, err)
	enqueue(t, b.pool, "last", "webhook", []int{1})
	r, _ := start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})

	// Slow by nature: each refused claim of the connector, and each probe of the
	// huge-numbers row, has PostgreSQL write out 1 GB of text before it refuses (16–22 s
	// for the whole burial on a 2-core machine alone, quiet or with both cores busy), and
	// once in CI, beside the other packages' tests, it took more than waitTimeout.
	for _, key := range []string{"before", "after-at-max", "last"} {
		waitStatusWithin(t, b.pool, key, outbox.StatusDelivered, 5*time.Minute)
	}
	for key, why := range map[string]string{
		"at-max":       "the relay cannot claim this row: its attempts count is at the integer maximum",
		"huge-numbers": "the relay cannot claim this row: its payload or headers cannot be read",
	} {
		// Read without the headers, which no one can read (outbox.Get neither).
		var (
			status, lastError string
			attempts          int
		)
		require.Eventually(t, func() bool {
			err := b.pool.QueryRow(t.Context(), `SELECT status, coalesce(last_error, ''), attempts FROM outbox WHERE idempotency_key = $1`,
				key).Scan(&status, &lastError, &attempts)
			return err == nil && status == outbox.StatusDead
		}, waitTimeout, 10*time.Millisecond, "%s never reached dead", key)
		require.Contains(t, lastError, why, key)
		require.Contains(t, lastError, "correct the row with SQL and replay it", key)
		require.Empty(t, attemptsOf(t, b.pool, key), key)
		if key == "at-max" {
			require.Equal(t, 2147483647, attempts)
		}
	}
	require.Equal(t, 3, b.receiver.TotalEffects())
	require.GreaterOrEqual(t, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim")), 1.0)
}

// A row that becomes due in the round that writes an outcome (the next row of the
// outcome's ordering key) and that the claim cannot take failed that round's
// transaction, the outcome's write with it: the outcome was never written, every round
// after failed the same, and the delivered row waited for its lease to run out, to be
// sent again. The outcome is written apart, and the row goes to dead.
func TestOutcomeInTheRoundOfAnUnclaimableRowIsWritten(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, attempts, ordering_key)
		VALUES ('first', 'webhook', '{}', 0, 'k'), ('at-max', 'webhook', '{}', 2147483647, 'k')`)
	require.NoError(t, err)
	cfg := b.fastConfig()
	cfg.Lease = time.Hour // no lease runs out during the test: the outcome is written, or never
	start(t, b.pool, cfg, map[string]Instance{"webhook": {Connector: b.hook}})

	waitStatus(t, b.pool, "first", outbox.StatusDelivered)
	waitStatus(t, b.pool, "at-max", outbox.StatusDead)
	require.Len(t, attemptsOf(t, b.pool, "first"), 1)
	require.Equal(t, 1, b.receiver.TotalEffects())
}

// A claim refused for anything but a row's data (here a constraint an application added
// to the table, which every claimed row breaks) buries nothing: the probe finds no row at
// fault, and the claim is retried, as any failure is, its rows left pending.
func TestClaimRefusedForAnotherReasonBuriesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, err := b.pool.Exec(t.Context(), `ALTER TABLE outbox ADD CONSTRAINT never_delivering CHECK (status <> 'delivering') NOT VALID`)
	require.NoError(t, err)
	enqueue(t, b.pool, "kept", "webhook", []int{1})
	r, _ := start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})

	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim")) >= 2 },
		waitTimeout, 10*time.Millisecond, "the claim fails, and is retried")
	in, err := outbox.Get(t.Context(), b.pool, "kept")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, in.Status)
	require.Equal(t, 0, in.Attempts)
	require.Empty(t, in.LastError)
	require.Zero(t, b.receiver.TotalEffects())
}

// In every query exec mode (the simple protocol behind a transaction pooler sends a
// round as one query string), the claim's refusal is told from the round's other
// statements, and the row at fault goes to dead.
func TestUnclaimableRowGoesDeadInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{})
			_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, attempts)
				VALUES ('at-max', 'webhook', '{}', 2147483647), ('plain', 'webhook', '{}', 0)`)
			require.NoError(t, err)
			start(t, pgtest.InMode(t, b.pool, mode), b.fastConfig(), map[string]Instance{"webhook": {Connector: b.hook}})
			waitStatus(t, b.pool, "plain", outbox.StatusDelivered)
			in := waitStatus(t, b.pool, "at-max", outbox.StatusDead)
			require.Contains(t, in.LastError, "its attempts count is at the integer maximum")
		})
	}
}

// The search for rows a claim cannot take locks rows over several statements: its
// transaction bounds how long it may idle, as reclaim's does (idleGate), so that a
// relay paused in the middle of it lets go of them within seconds.
func TestUnclaimableSearchBoundsItsIdleTime(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(t.Context()) }()
	_, err = tx.Exec(t.Context(), unclaimableDueSQL, "webhook", time.Now(), 10,
		claimPlan{}.start())
	require.NoError(t, err)
	var idle string
	require.NoError(t, tx.QueryRow(t.Context(), `SHOW idle_in_transaction_session_timeout`).Scan(&idle))
	require.Equal(t, "5s", idle)
}
