package relay

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// TestReadmeListsEveryMetric keeps the README's table of metrics true: every series a
// relay serves on /metrics has a row there with its type and labels, and every row names
// a series the relay serves. The README named only five of the fourteen, so an operator
// had to scrape a running relay to learn what to alert on (lease expiries, the lag, the
// database's errors) and what its labels were.
func TestReadmeListsEveryMetric(t *testing.T) {
	t.Parallel()

	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	rows := readmeMetrics(string(readme))
	require.NotEmpty(t, rows, "README.md has no table of metrics (| metric | type | labels | what it measures |)")

	pool := pgtest.DB(t)
	enqueue(t, pool, "waiting", "webhook", []int{1})
	enqueue(t, pool, "elsewhere", "webhook:gone", []int{2})
	reg := prometheus.NewRegistry()
	r, err := New(pool, &Config{Registerer: reg, Logger: testLogger()},
		map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	// The series the gauges' refresh makes, as a running relay's first pass does.
	r.refreshStats(t.Context())

	families, err := reg.Gather()
	require.NoError(t, err)
	served := make(map[string]bool)
	for _, f := range families {
		served[f.GetName()] = true
		row, ok := rows[f.GetName()]
		require.True(t, ok, "README.md's table of metrics has no row for %s (%s)", f.GetName(), f.GetHelp())
		require.Equal(t, strings.ToLower(f.GetType().String()), row.typ, "README.md's type of %s", f.GetName())
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, "`"+l.GetName()+"`")
		}
		slices.Sort(labels)
		want := "(none)"
		if len(labels) > 0 {
			want = strings.Join(labels, ", ")
		}
		require.Equal(t, want, row.labels, "README.md's labels of %s", f.GetName())
	}
	for name := range rows {
		require.True(t, served[name], "README.md's table of metrics lists %s, which a relay does not serve", name)
	}
}

// readmeMetric is a row of the README's table of metrics.
type readmeMetric struct{ typ, labels string }

var readmeMetricRow = regexp.MustCompile("(?m)^\\| `(outboxd_[a-z_]+)` \\| ([a-z]+) \\| ([^|]*) \\|")

// readmeMetrics returns the rows of the README's table of metrics, by series name.
func readmeMetrics(readme string) map[string]readmeMetric {
	_, table, ok := strings.Cut(readme, "\n| metric | type | labels | what it measures |\n")
	if !ok {
		return nil
	}
	table, _, _ = strings.Cut(table, "\n\n")
	out := make(map[string]readmeMetric)
	for _, m := range readmeMetricRow.FindAllStringSubmatch(table, -1) {
		out[m[1]] = readmeMetric{typ: m[2], labels: strings.TrimSpace(m[3])}
	}
	return out
}
