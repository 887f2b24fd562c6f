package relay

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// outboxd_database_errors_total has a series for every operation, at 0, before its first
// failure: a series that appears with that failure, at 1, shows no increase to rate() and
// increase(), which need a sample before it, so an alert on them missed the first failure
// of each operation (the only one, for a failure that does not last).
func TestDatabaseErrorSeriesExistBeforeTheFirstFailure(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r, err := New(pgtest.DB(t), &Config{Registerer: reg, Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	// Counted before the lookups below, which would make the series.
	require.Equal(t, 9, testutil.CollectAndCount(reg, "outboxd_database_errors_total"), "a series for each operation before any failure")
	for _, op := range []string{"claim", "record", "release", "reclaim", "listen", "seen", "park", "stats", "retention"} {
		require.Zero(t, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues(op)), op)
	}
}

// dbErrorsTotal is how many database operations of r failed, of every kind.
func dbErrorsTotal(t *testing.T, r *Relay) float64 {
	t.Helper()
	var n float64
	for _, op := range dbOperations {
		n += testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues(op))
	}
	return n
}
