package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// With more instances than the relay may hold rows (rate-limited instances claim no
// rows ahead, so it holds at most Concurrency), every instance still gets its due rows
// claimed: share used to cut the alphabetically first instances to zero in every round,
// so their rows were never claimed at all, even with the relay idle.
func TestEveryInstanceClaimsWithMoreInstancesThanRoom(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	cfg.Concurrency = 4
	instances := map[string]Instance{}
	for i := range 12 {
		instances[fmt.Sprintf("webhook:i%02d", i)] = Instance{Connector: b.hook, Rate: 100}
	}
	r, err := New(b.pool, cfg, instances)
	require.NoError(t, err)
	require.Equal(t, 4, r.maxClaimed)
	enqueue(t, b.pool, "first", "webhook:i00", []int{1})

	claimed := 0
	for range 10 {
		claimed += claimOnce(t, r)
		if claimed > 0 {
			break
		}
	}
	require.Equal(t, 1, claimed, "the idle relay claims the only due row")
	require.Equal(t, "first", (<-r.instances["webhook:i00"].jobs).key)
}

// A small instance with one due row gets it claimed at once while a big one keeps the
// relay's claims full: rows finish one at a time, so each round has a quarter of the
// room, fewer rows than there are instances.
func TestSmallInstanceClaimsWhileABigOneKeepsClaimsFull(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	cfg.Concurrency = 8
	instances := map[string]Instance{}
	for i := range 49 {
		instances[fmt.Sprintf("webhook:i%02d", i)] = Instance{Connector: b.hook}
	}
	instances["webhook:zz"] = Instance{Connector: b.hook}
	r, err := New(b.pool, cfg, instances)
	require.NoError(t, err)
	require.Greater(t, len(instances), r.maxClaimed/4, "a quarter of the room is less than one row per instance")

	msgs := make([]outbox.Message, 400)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: fmt.Sprint("big-", i), Connector: "webhook:zz", Payload: []int{i}}
	}
	_, err = outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	big := r.instances["webhook:zz"]
	for range 200 { // claim until the room is spent
		if claimOnce(t, r) == 0 {
			break
		}
	}
	require.Less(t, r.maxClaimed-int(r.claimedRows.Load()), r.maxClaimed/4)

	enqueue(t, b.pool, "small", "webhook:i00", []int{1})
	small := r.instances["webhook:i00"]
	for range 20 {
		r.done(big, <-big.jobs) // a big row finishes, making room for a round
		claimOnce(t, r)
		if len(small.jobs) > 0 {
			break
		}
	}
	require.Len(t, small.jobs, 1, "the small instance's row is claimed while the big one keeps the claims full")
}

// The payload bytes a relay holds stay within MaxClaimedBytes (passed by one row per
// instance at most) when the payloads compress well: the claim used to count them as
// PostgreSQL stores them, compressed, while the relay holds them whole, so one claim of
// ten 100 kB payloads that PostgreSQL keeps in about a kilobyte each took all ten
// against a bound of 100 kB.
func TestCompressiblePayloadsStayWithinTheBound(t *testing.T) {
	t.Parallel()
	b, r := boundedRelay(t)
	msgs := make([]outbox.Message, 10)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: fmt.Sprint("compressible-", i), Connector: "webhook",
			Payload: map[string]string{"data": strings.Repeat("abcdefgh", 100_000/8)}}
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	var stored int64
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT max(pg_column_size(payload)) FROM outbox`).Scan(&stored))
	require.Less(t, stored, int64(10_000), "PostgreSQL compresses them")

	claimOnce(t, r)
	requireWithinBound(t, r, 100_100)
}

// countingHandler counts the log records at warning level or above.
type countingHandler struct{ warnings *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countingHandler) WithGroup(string) slog.Handler            { return h }

func (h countingHandler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		h.warnings.Add(1)
	}
	return nil
}

// Rows for many distinct connectors no relay has (an application or an agent whose
// token allows every connector writing webhook:<customer>) neither flood the log nor
// make a series each: every refresh used to log a warning per connector, each with the
// list of configured instances, and outboxd_unknown_connector_rows grew a series per
// name.
func TestManyUnknownConnectorsAreReportedInBoundedForm(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload)
		SELECT 'u' || g, 'webhook:customer_' || g, '{}' FROM generate_series(1, 500) g`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload)
		SELECT 'many' || g, 'webhook:customer_7', '{}' FROM generate_series(1, 10) g`)
	require.NoError(t, err)
	var warnings atomic.Int64
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(),
		Logger: slog.New(countingHandler{warnings: &warnings})},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.refreshStats(t.Context())
	require.LessOrEqual(t, warnings.Load(), int64(1), "one warning per refresh, however many connectors")
	require.LessOrEqual(t, testutil.CollectAndCount(r.metrics.unknownConnector), maxUnknownSeries+1, "the series are bounded")
	require.Equal(t, 11.0, testutil.ToFloat64(r.metrics.unknownConnector.WithLabelValues("webhook:customer_7")),
		"the connector with most rows has its own series")
	var total float64
	ch := make(chan prometheus.Metric, 1000)
	r.metrics.unknownConnector.Collect(ch)
	close(ch)
	for m := range ch {
		var pb dto.Metric
		require.NoError(t, m.Write(&pb))
		total += pb.GetGauge().GetValue()
	}
	require.Equal(t, 510.0, total, "every row is counted")
}

// A row's headers count toward MaxClaimedBytes as its payload does: the relay holds
// them too, and nothing bounds their size (a plain INSERT, or Enqueue, may write
// large ones). Ten rows with 60 kB of headers each and tiny payloads were claimed
// together against a bound of 100 kB.
func TestLargeHeadersCountTowardTheBound(t *testing.T) {
	t.Parallel()
	b, r := boundedRelay(t)
	msgs := make([]outbox.Message, 10)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: fmt.Sprint("headers-", i), Connector: "webhook", Payload: []int{i},
			Headers: map[string]string{"x-big": randomText(t, 60_000)}}
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	require.Equal(t, 2, claimOnce(t, r), "rows while those before add up to less than 100 kB")
	require.InDelta(t, 2*60_000, r.claimedBytes.Load(), 2*100)
}

// MaxClaimedBytes counts a row as the relay holds it: its payload's JSON text. An
// uncompressed payload was counted at its stored (binary jsonb) size, and jsonb's text
// escapes control characters as \u00XX: six bytes for each one stored. Rows of 1,500
// such characters (too small for PostgreSQL to compress) were counted at about 1.5 kB
// and held at 9 kB each, so one claim held six times the bound.
func TestEscapedPayloadsStayWithinTheBound(t *testing.T) {
	t.Parallel()
	b, r := boundedRelay(t)
	msgs := make([]outbox.Message, 60)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: fmt.Sprint("escaped-", i), Connector: "webhook",
			Payload: map[string]string{"data": strings.Repeat("\x01", 1500)}}
	}
	_, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	var stored, held int64
	require.NoError(t, b.pool.QueryRow(t.Context(),
		`SELECT max(pg_column_size(payload)), max(octet_length(payload::text)) FROM outbox`).Scan(&stored, &held))
	require.Less(t, stored, int64(2_000), "stored uncompressed, at about one byte a character")

	claimOnce(t, r)
	requireWithinBound(t, r, held+100)
}

// boundedRelay is a relay whose claims stop at 100 kB of rows held (MaxClaimedBytes).
func boundedRelay(t *testing.T) (*testBundle, *Relay) {
	t.Helper()
	b := setup(t, receiver.Options{})
	_, cfg := b.clockedConfig(t)
	cfg.MaxClaimedBytes = 100_000
	return b, b.newRelay(t, cfg)
}

// requireWithinBound checks that r holds at most its MaxClaimedBytes and one row of row
// bytes more.
func requireWithinBound(t *testing.T, r *Relay, row int64) {
	t.Helper()
	require.LessOrEqual(t, r.claimedBytes.Load(), r.cfg.MaxClaimedBytes+row,
		"at most one row past the bound (%d rows claimed, %d bytes a row)", len(r.instances["webhook"].jobs), row)
}
