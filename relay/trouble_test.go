package relay

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	clock, r, logs := troubleRelay(t, pgtest.DB(t))
	lines := func(level string) []string { return logs.linesOf(level, reclaimFailed) }
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

// A failure of a kind not warned about within the minute is an operator's news, and is
// warned about at once, though the same work failed and was warned about less than a
// minute before: counted into the next warning, a failover to a server that takes no
// writes (the claim loop's first refused round resets the pool, and the next works)
// within a minute of a flaky network's warning was said only as a number, its error
// never, and no line said the work went on. Failures of a kind warned about within the
// minute are still counted into the next warning.
func TestAFailureOfAnotherKindIsWarnedAboutAtOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	clock, r, logs := troubleRelay(t, pool)
	lines := func(level string) []string { return logs.linesOf(level, claimFailed) }
	// Both errors as they come: a connection refused, and a write refused by a server
	// that takes none.
	_, refusedConn := pgx.Connect(t.Context(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
	require.Error(t, refusedConn)
	tx, err := pool.BeginTx(t.Context(), pgx.TxOptions{AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	_, readOnly := tx.Exec(t.Context(), `UPDATE outbox SET attempts = attempts WHERE false`)
	require.True(t, takesNoWrites(readOnly), "%v", readOnly)
	require.NoError(t, tx.Rollback(t.Context()))

	r.failed(t.Context(), "claim", claimFailed, refusedConn)
	clock.Advance(time.Second)
	r.recovered(t.Context(), claimFailed)
	require.Len(t, lines("WARN"), 1)
	require.Len(t, lines("INFO"), 1)

	clock.Advance(10 * time.Second)
	r.failed(t.Context(), "claim", claimFailed, readOnly)
	warned := lines("WARN")
	require.Len(t, warned, 2, "a failure of another kind is warned about at once: %s", logs.String())
	require.Contains(t, warned[1], "read-only transaction")
	clock.Advance(time.Second)
	r.recovered(t.Context(), claimFailed)
	require.Len(t, lines("INFO"), 2, "and the line that the work goes on comes at once: %s", logs.String())

	clock.Advance(10 * time.Second)
	r.failed(t.Context(), "claim", claimFailed, readOnly)
	r.failed(t.Context(), "claim", claimFailed, refusedConn)
	require.Len(t, lines("WARN"), 2, "kinds warned about within the minute are counted, not warned about: %s", logs.String())

	clock.Advance(troubleWarnEvery)
	r.failed(t.Context(), "claim", claimFailed, refusedConn)
	warned = lines("WARN")
	require.Len(t, warned, 3, "a minute after the last warning: %s", logs.String())
	require.Contains(t, warned[2], "failed_since_last_warning=2")
	require.Equal(t, 5.0, testutil.ToFloat64(r.metrics.dbErrors.WithLabelValues("claim")), "every failure is counted")
}

// troubleRelay is a relay (not running) on an injected clock, whose text log the test
// reads.
func troubleRelay(t *testing.T, pool *pgxpool.Pool) (*testClock, *Relay, *logBuffer) {
	t.Helper()
	clock, logs := &testClock{now: time.Now()}, &logBuffer{}
	r, err := New(pool, &Config{NowFunc: clock.Now, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(logs, nil))}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	return clock, r, logs
}

// linesOf returns the lines of the text log at level that carry msg.
func (l *logBuffer) linesOf(level, msg string) []string {
	var out []string
	for line := range strings.Lines(l.String()) {
		if strings.Contains(line, "level="+level) && strings.Contains(line, msg) {
			out = append(out, line)
		}
	}
	return out
}
