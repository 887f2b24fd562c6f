package relay

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// When the LISTEN connection comes back, the claim that follows starts at the head of
// the index: the notifications sent while it was down are lost, and one of them may have
// been for a row that lies behind where claims start (an approved or replayed row keeps
// its next_attempt_at), as a notification that arrives makes it. It used to wake the
// claim loop without a rescan, so such a row waited for the next full scan, up to a poll
// interval (or more) after the connection was back.
func TestListenReconnectRescans(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	r := b.startNotifyOnly(t)
	enqueue(t, b.pool, "first", "webhook", []int{0})
	waitStatus(t, b.pool, "first", outbox.StatusDelivered)

	allow := b.connectionGate(t)
	conn, err := b.pool.Acquire(t.Context()) // for the insert while no new connection is allowed
	require.NoError(t, err)

	allow(false)
	killListen(t, b.pool)
	require.Eventually(t, func() bool { return !r.listening.Load() }, waitTimeout, 10*time.Millisecond, "LISTEN is down")
	// A row due an hour ago (as an approved row created then is): its NOTIFY is lost.
	_, err = conn.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, next_attempt_at)
		VALUES ('behind', 'webhook', '[1]', now() - interval '1 hour')`)
	conn.Release()
	require.NoError(t, err)

	allow(true)
	require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	waitStatus(t, b.pool, "behind", outbox.StatusDelivered)
}

// A relay busy with other connector instances does not make the inserts of this relay's
// instances skip NOTIFY. Version 4 had one fast-polling mark for every relay on the
// database, and a relay that polls fast claims only its own instances: relays
// configured with different instances share one database (retention, for one, is per
// instance), and an idle one found its rows only at its poll interval while another was
// busy. Here relay A serves only webhook:a and polls fast; this relay serves webhook,
// polls hourly and is idle.
func TestFastPollingRelayOfOtherConnectorsDoesNotSilenceInserts(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	b.startNotifyOnly(t)
	require.Eventually(t, func() bool {
		var seen bool
		require.NoError(t, b.pool.QueryRow(t.Context(),
			`SELECT count(*) = 1 FROM outbox_wake_connectors WHERE connector = 'webhook' AND seen_until > clock_timestamp()`).Scan(&seen))
		return seen
	}, waitTimeout, 10*time.Millisecond, "the running relay says it has webhook")
	a, err := New(b.pool, b.fastConfig(), map[string]Instance{"webhook:a": {Connector: b.hook}})
	require.NoError(t, err)
	_, err = a.pool.Exec(t.Context(), pollFastSQL, a.ID(), a.names, time.Hour) // relay A polls fast
	require.NoError(t, err)

	enqueue(t, b.pool, "for-this-relay", "webhook", []int{1})
	waitStatus(t, b.pool, "for-this-relay", outbox.StatusDelivered)
}

// The LISTEN connection's reconnect waits start again from the shortest after a
// connection that was up: each drop of a long-lived connection is a first failure. The
// count of failures used to grow with every drop over the relay's life, so that after a
// few drops each reconnect waited up to 5s, with notifications lost and readiness
// failing all the while.
func TestListenReconnectWaitStartsAgainAfterAGoodConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	var logs logBuffer
	clock, cfg := b.clockedConfig(t)
	cfg.PollInterval = time.Hour
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	r := b.newRelay(t, cfg)
	run(t, r)
	up := func() {
		t.Helper()
		require.Eventually(t, func() bool { return r.Ready(t.Context()) == nil }, waitTimeout, 10*time.Millisecond)
	}
	up()
	// Each drop is awaited by its log record, which stays, not by catching the LISTEN
	// flag down: that lasts only the first reconnect wait (80-120ms), and a test
	// goroutine that does not run within it (a busy machine) would never see it.
	lost := func() int {
		return strings.Count(logs.String(), `"msg":"LISTEN connection lost`)
	}
	const drops = 4
	for i := range drops {
		// A minute apart on the relay's clock: drops within a minute of the last warning
		// are counted in the next one rather than warned about each (see Relay.failed).
		clock.Advance(troubleWarnEvery)
		killListen(t, b.pool)
		require.Eventually(t, func() bool { return lost() >= i+1 }, waitTimeout, 10*time.Millisecond, "drop %d noticed", i+1)
		up() // listening is cleared before the record is logged: ready again means reconnected
	}

	var waits []time.Duration
	for line := range strings.Lines(logs.String()) {
		var rec struct {
			Msg     string        `json:"msg"`
			RetryIn time.Duration `json:"retry_in"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		if strings.HasPrefix(rec.Msg, "LISTEN connection lost") {
			waits = append(waits, rec.RetryIn)
		}
	}
	require.Len(t, waits, drops, logs.String())
	for i, w := range waits {
		require.LessOrEqual(t, w, 120*time.Millisecond, "drop %d of a connection that was up waits the first step (100ms ±20%%): %v", i+1, waits)
	}
}

// A relay that stops takes back only its own words in outbox_wake_connectors: another
// relay still running with the same instance, idle, goes on hearing of that instance's
// rows at once while a relay busy with other instances polls fast. (With one row per
// instance, the stopping relay ended the word of every relay with the instance, until
// the idle relay's next renewal, and the row waited for its poll interval.)
func TestStoppingRelayDoesNotSilenceAnotherWithTheSameInstance(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	idle := b.startNotifyOnly(t) // has webhook, polls hourly
	require.Eventually(t, func() bool { return len(wakeRows(t, b, idle.ID())) == 1 }, waitTimeout, 10*time.Millisecond,
		"the running relay says it has webhook")

	// Another relay with webhook says so, then stops.
	other := b.newRelay(t, separateMetrics(b.fastConfig()))
	other.seen(t.Context())
	require.Len(t, wakeRows(t, b, other.ID()), 1)
	other.withdraw(t.Context())
	require.Empty(t, wakeRows(t, b, other.ID()), "the stopped relay's words are gone")
	require.Len(t, wakeRows(t, b, idle.ID()), 1, "the idle relay's word stands")
	// A relay of another instance polls fast.
	a := b.newRelay(t, separateMetrics(b.fastConfig()))
	_, err := b.pool.Exec(t.Context(), pollFastSQL, a.ID(), []string{"webhook:a"}, time.Hour)
	require.NoError(t, err)

	enqueue(t, b.pool, "for-the-idle-relay", "webhook", []int{1})
	waitStatus(t, b.pool, "for-the-idle-relay", outbox.StatusDelivered)
}

// separateMetrics gives cfg a registry of its own, for a test that runs several relays.
func separateMetrics(cfg *Config) *Config {
	cfg.Registerer = prometheus.NewRegistry()
	return cfg
}

// wakeRows returns the instances relay id has words about in outbox_wake_connectors.
func wakeRows(t *testing.T, b *testBundle, id string) []string {
	t.Helper()
	rows, err := b.pool.Query(t.Context(), `SELECT connector FROM outbox_wake_connectors WHERE relay_id = $1 ORDER BY connector`, id)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// Relays with the same instances never wait for each other in outbox_wake_connectors: a
// relay renewing its words, or stopping, while another holds the rows of the same
// instances (in the middle of its own renewal) goes through at once. With one row per
// instance they locked the same rows, and a withdrawal that took them in another order
// than a renewal deadlocked with it.
func TestRelaysSharingInstancesDoNotWaitForEachOther(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	names := []string{"webhook", "webhook:a"}
	holder, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = holder.Exec(t.Context(), seenSQL, "relay-b", names, time.Minute, seenGoneAfter)
	require.NoError(t, err)
	_, err = holder.Exec(t.Context(), pollFastSQL, "relay-b", names, time.Minute)
	require.NoError(t, err)

	// Any wait for a lock fails at once instead of blocking the test.
	for _, step := range []struct {
		sql  string
		args []any
	}{
		{seenSQL, []any{"relay-a", names, time.Minute, seenGoneAfter}},
		{pollFastSQL, []any{"relay-a", names, time.Minute}},
		{withdrawSQL, []any{"relay-a"}},
	} {
		tx, err := b.pool.Begin(t.Context())
		require.NoError(t, err)
		_, err = tx.Exec(t.Context(), `SET LOCAL lock_timeout = '1ms'`)
		require.NoError(t, err)
		_, err = tx.Exec(t.Context(), step.sql, step.args...)
		require.NoError(t, err, "%s waited for the other relay's rows", step.sql)
		require.NoError(t, tx.Commit(t.Context()))
	}
}

// A relay that stops withdraws its words in outbox_wake_connectors as its claim loop
// ends; a renewal that lands after that (one still running in the database when the
// relay was asked to stop) brought them back, for a minute after the relay was gone
// (other relays took its instances for run, and inserts sent NOTIFY no relay needed).
// They stay withdrawn.
func TestStoppingRelayDoesNotRenewItsWithdrawnWords(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	var errs atomic.Int64
	cfg := separateMetrics(b.fastConfig())
	cfg.Logger = slog.New(sameIDErrors{&errs})
	r := b.newRelay(t, cfg)
	r.seen(t.Context())
	r.seen(t.Context())
	require.Len(t, wakeRows(t, b, r.ID()), 1)

	r.withdraw(t.Context()) // the claim loop has ended
	r.seen(t.Context())     // a renewal that lands after the withdrawal
	require.Empty(t, wakeRows(t, b, r.ID()), "the stopping relay's words stay withdrawn")
	require.Zero(t, errs.Load(), "the relay's own withdrawal is not another relay with its ID")
}
