package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// Rows for many connectors this relay does not have (webhook:<customer>, written by an
// application) must not grow a series each in outboxd_rows and
// outboxd_oldest_pending_age_seconds: outboxd_unknown_connector_rows was bounded to 20
// names plus "(others)", but the row gauges still took every name in the table.
func TestRowGaugesAreBoundedForUnknownConnectors(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload)
		SELECT 'u' || g, 'webhook:customer_' || g, '{}' FROM generate_series(1, 200) g`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, status)
		SELECT 'd' || g, 'webhook:gone_' || g, '{}', 'dead' FROM generate_series(1, 100) g`)
	require.NoError(t, err)
	enqueue(t, pool, "mine", "webhook", []int{1})
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.refreshStats(t.Context())

	// The configured instance's four statuses, and at most maxUnknownSeries other
	// connectors by name plus "(others)", as outboxd_unknown_connector_rows.
	require.LessOrEqual(t, testutil.CollectAndCount(r.metrics.rows), len(knownStatuses)+2*(maxUnknownSeries+1), "outboxd_rows is bounded")
	require.LessOrEqual(t, testutil.CollectAndCount(r.metrics.oldestPending), 1+maxUnknownSeries+1, "outboxd_oldest_pending_age_seconds is bounded")
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.rows.WithLabelValues("webhook", "pending")))
	// Nothing is lost from the totals.
	sum := func(status string) float64 {
		ch := make(chan prometheus.Metric, 1000)
		r.metrics.rows.Collect(ch)
		close(ch)
		var total float64
		for m := range ch {
			var pb dto.Metric
			require.NoError(t, m.Write(&pb))
			for _, l := range pb.GetLabel() {
				if l.GetName() == "status" && l.GetValue() == status {
					total += pb.GetGauge().GetValue()
				}
			}
		}
		return total
	}
	require.Equal(t, 201.0, sum("pending"))
	require.Equal(t, 100.0, sum("dead"))
}

// handBackCounter counts the relay's warnings about rows handed back, and its info
// lines about released rows.
type handBackCounter struct {
	warnings, released *atomic.Int64
}

func (h handBackCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h handBackCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h handBackCounter) WithGroup(string) slog.Handler            { return h }

func (h handBackCounter) Handle(_ context.Context, rec slog.Record) error {
	switch {
	case strings.Contains(rec.Message, "handing it back"):
		h.warnings.Add(1)
	case strings.Contains(rec.Message, "released rows not started"):
		h.released.Add(1)
	}
	return nil
}

// While another instance's slow attempts hold every delivery slot, every row of a fast
// instance claimed ahead is handed back, claimed again and handed back again, as long as
// the slow receiver lasts: that used to log a warning and an info line per row each
// time (at the defaults, some 2,700 rows every few seconds), a flood that hides
// everything else. The metric counts each row; the log says so once in a while.
func TestRowsHandedBackBehindASlowSlotDoNotFloodTheLog(t *testing.T) {
	t.Parallel()
	slowHook, slow, release := newSlowHook(t)
	b := setup(t, receiver.Options{})
	clock, cfg := b.clockedConfig(t)
	cfg.Concurrency = 1
	cfg.Lease = 6 * time.Second // the webhook hook's 5s limit leaves a row 500ms to start
	var warnings, released atomic.Int64
	cfg.Logger = slog.New(handBackCounter{warnings: &warnings, released: &released})
	r, _ := start(t, b.pool, cfg, map[string]Instance{
		"webhook":      {Connector: b.hook},
		"webhook:slow": {Connector: slowHook},
	})
	inst := r.instances["webhook"]
	require.Equal(t, 20, inst.ahead)

	enqueue(t, b.pool, "slow", "webhook:slow", []int{0})
	require.Eventually(t, func() bool { return slow.TotalEffects() == 1 }, waitTimeout, 10*time.Millisecond,
		"the slow attempt holds the one slot")
	const rows = 20 // what the relay may hold claimed besides the slow row (maxClaimed is 21)
	// In one transaction, so that one round claims them all: a round waits for a quarter
	// of the room, and rows arriving one by one could leave less.
	msgs := make([]outbox.Message, rows)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: fmt.Sprint("fast-", i), Connector: "webhook", Payload: []int{i}}
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return inst.claimed.Load() == rows }, waitTimeout, 10*time.Millisecond,
		"every fast row is claimed and waits for the slot")
	clock.Advance(time.Second) // every one of them is past its 500ms to start
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.handedBack) >= rows }, waitTimeout, 10*time.Millisecond,
		"every row is handed back")
	require.LessOrEqual(t, warnings.Load(), int64(1), "one warning for the lot, not one per row")
	require.Zero(t, released.Load(), "no info line per row handed back")
	release()
}

// Rows for a connector no running relay has may wait for days (an instance removed from
// the configuration with rows left): the warning about them came at every refresh of
// the gauges, every ten seconds on every relay, saying nothing new. It comes at once for
// a connector the last one did not name, and otherwise once a minute; the gauge follows
// every refresh.
func TestUnknownConnectorWarningIsNotRepeatedAtEveryRefresh(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "crm-1", "webhook:crm", []int{1})
	clock := &testClock{now: dbNow(t, pool)}
	var logs logBuffer
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), NowFunc: clock.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	warned := func() int {
		return strings.Count(logs.String(), "rows waiting for connectors this relay does not have")
	}
	refresh := func() {
		t.Helper()
		r.refreshStats(t.Context())
		clock.Advance(statsInterval)
	}

	refresh()
	refresh()
	refresh()
	require.Equal(t, 1, warned(), "once for three refreshes: %s", logs.String())
	require.Equal(t, 1.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:crm")))

	enqueue(t, pool, "billing-1", "webhook:billing", []int{1})
	refresh()
	require.Equal(t, 2, warned(), "a connector the last warning did not name is warned about at once")
	refresh()
	require.Equal(t, 2, warned())

	clock.Advance(troubleWarnEvery)
	refresh()
	require.Equal(t, 3, warned(), "a minute on, they are still waiting")

	_, err = pool.Exec(t.Context(), `DELETE FROM outbox`)
	require.NoError(t, err)
	refresh()
	require.Zero(t, testutil.CollectAndCount(r.metrics.unknownConnector))
	enqueue(t, pool, "crm-2", "webhook:crm", []int{2})
	refresh()
	require.Equal(t, 4, warned(), "rows that come again are warned about at once")
}
