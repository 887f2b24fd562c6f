package relay

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// Work that fails now and then (a flaky network, a statement timeout under load) fails
// and works by turns. Each failure began a run of its own, warned about at once, and
// each success ended it with a line of its own: two lines every poll interval for as
// long as it went on, which the once-a-minute warnings were meant to stop. Failures
// within a minute of the last warning are now counted, and said at the next warning or,
// once the minute is over, at the next success; the metric counts every one.
func TestFailuresOnAndOffAreWarnedAboutOnceAMinute(t *testing.T) {
	t.Parallel()
	clock := &testClock{now: time.Now()}
	var logs logBuffer
	r, err := New(pgtest.DB(t), &Config{NowFunc: clock.Now, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	lines := func(level string) []string {
		var out []string
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "level="+level) && strings.Contains(l, reclaimFailed) {
				out = append(out, l)
			}
		}
		return out
	}
	flaky := errors.New("connection reset by peer")
	onAndOff := func(times int) {
		t.Helper()
		for range times {
			r.failed(t.Context(), "reclaim", reclaimFailed, flaky)
			clock.Advance(time.Second)
			r.recovered(t.Context(), reclaimFailed)
			clock.Advance(time.Second)
		}
	}

	onAndOff(5)
	require.Len(t, lines("WARN"), 1, "one warning for five failures within a minute: %s", logs.String())
	require.Len(t, lines("INFO"), 1, "and one line when the first run ended: %s", logs.String())

	clock.Advance(troubleWarnEvery)
	r.recovered(t.Context(), reclaimFailed)
	info := lines("INFO")
	require.Len(t, info, 2, "once the minute is over, a success says what failed since: %s", logs.String())
	require.Contains(t, info[1], "failed_since_last_warning=4")

	onAndOff(3)
	warned := lines("WARN")
	require.Len(t, warned, 2, "the next failure is warned about: %s", logs.String())
	require.NotContains(t, warned[1], "failed_since_last_warning", "the failures before were said")
	require.Len(t, lines("INFO"), 3)
	require.Equal(t, 8.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("reclaim")), "every failure is counted")
}
