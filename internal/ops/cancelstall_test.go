package ops_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// stallAt blocks the client of a pool before it sends a statement containing at, once
// armed, until resume is closed: a process suspended (Ctrl-Z), a laptop asleep or a
// network gone in the middle of a command's transaction.
type stallAt struct {
	at      string
	armed   atomic.Bool
	stalled chan struct{} // closed when it stalls
	resume  chan struct{}
}

func (s *stallAt) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, s.at) && s.armed.CompareAndSwap(true, false) {
		close(s.stalled)
		<-s.resume
	}
	return ctx
}

func (s *stallAt) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// stalledApp is the application_name of a stalled pool's sessions.
const stalledApp = "outboxd-test-stalled"

// stalledPool returns a pool on pool's database whose client stalls before it sends a
// statement containing at, and the stall; resume it with the returned function.
func stalledPool(t *testing.T, pool *pgxpool.Pool, at string) (*pgxpool.Pool, *stallAt, func()) {
	t.Helper()
	stall := &stallAt{at: at, stalled: make(chan struct{}), resume: make(chan struct{})}
	resume := sync.OnceFunc(func() { close(stall.resume) })
	t.Cleanup(resume)
	pc := pool.Config()
	pc.ConnConfig.Tracer = stall
	pc.ConnConfig.RuntimeParams["application_name"] = stalledApp
	p, err := pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	stall.armed.Store(true)
	return p, stall, resume
}

// A cancel, approve or reject whose client stood still inside its transaction
// (suspended, its network gone) held its rows locked until the server noticed the session
// was gone, hours later with TCP keepalive's defaults. A relay that recorded the outcome
// of the row before one of them in its ordering key waited for that lock (it releases
// the key's next row), and with it every outcome and claim of its rounds: nothing was
// delivered meanwhile. The command's session is now ended once it idles in its
// transaction for a few seconds, and nothing of it is committed.
func TestStalledOperatorWriteDoesNotStopTheRelay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		awaiting bool // k-2 awaits approval
		do       func(ctx context.Context, pool *pgxpool.Pool) error
	}{
		{name: "cancel", do: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := ops.Cancel(ctx, pool, []string{"k-2"}, "alice", "", time.Time{})
			return err
		}},
		{name: "approve", awaiting: true, do: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := ops.Approve(ctx, pool, "k-2", "alice", "", time.Time{})
			return err
		}},
		{name: "reject", awaiting: true, do: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := ops.Reject(ctx, pool, "k-2", "alice", "", time.Time{})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.DB(t)
			rcv, err := receiver.Start(receiver.Options{})
			require.NoError(t, err)
			t.Cleanup(rcv.Close)
			for _, k := range []string{"k-1", "k-2"} {
				_, err := outbox.Enqueue(ctx, pool, outbox.Message{Key: k, Connector: "webhook", OrderingKey: "o",
					Payload: []byte(`{"n": 1}`), RequireApproval: k == "k-2" && tc.awaiting})
				require.NoError(t, err)
			}

			stalled, stall, resume := stalledPool(t, pool, "INSERT INTO outbox_audit")
			done := make(chan error, 1)
			go func() { done <- tc.do(ctx, stalled) }()
			<-stall.stalled // the command holds k-2, and its client stands still

			hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Enforced, Timeout: 5 * time.Second})
			require.NoError(t, err)
			r, err := relay.New(pool, &relay.Config{PollInterval: 20 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
				Logger: slog.New(slog.DiscardHandler)},
				map[string]relay.Instance{"webhook": {Connector: hook}})
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- r.Run(runCtx) }()
			defer func() {
				stop()
				require.NoError(t, <-ran)
			}()
			defer resume() // first: the relay stops only once its outcome is written
			require.Eventually(t, func() bool {
				return count(t, pool, `SELECT count(*) FROM outbox WHERE idempotency_key = 'k-1' AND status = 'delivered'`) == 1
			}, 20*time.Second, 20*time.Millisecond, "the relay's outcome of k-1 waited for the stalled %s", tc.name)
			// The relay need not wait for it (an outcome held up only by a lock on its key's
			// next row is written at once); the server ends the stalled session on its own.
			require.Eventually(t, func() bool {
				return count(t, pool, `SELECT count(*) FROM pg_stat_activity
					WHERE application_name = '`+stalledApp+`' AND state = 'idle in transaction'`) == 0
			}, 20*time.Second, 20*time.Millisecond, "the stalled %s's session was not ended", tc.name)

			resume()
			require.Error(t, <-done, "the %s's session was ended", tc.name)
			require.Zero(t, count(t, pool, `SELECT count(*) FROM outbox_audit`), "nothing of it committed")
			require.Equal(t, 1, rcv.Effects("k-1"))
		})
	}
}

// A replay --dry-run or --new-key locks its rows as a replay does, without the replay's
// limits (the wait for claims is not theirs to take): a client that stood still inside
// one held the rows until the server noticed the session was gone, hours later. Its
// session is now ended once it idles in its transaction for a few seconds.
func TestStalledDryRunOrNewKeyReplayIsEnded(t *testing.T) {
	t.Parallel()
	for _, opts := range []ops.ReplayOptions{{Actor: "alice", DryRun: true}, {Actor: "alice", NewKey: true}} {
		t.Run(fmt.Sprintf("dry_run=%v,new_key=%v", opts.DryRun, opts.NewKey), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			insertRow(t, pool, row{Key: "dead", Status: outbox.StatusDead, Attempts: 1})
			stalled, stall, resume := stalledPool(t, pool, "a.action = 'replay' AND a.details->>'new_key'")
			done := make(chan error, 1)
			go func() {
				_, err := ops.Replay(t.Context(), stalled, ops.Selection{Keys: []string{"dead"}}, opts)
				done <- err
			}()
			<-stall.stalled // the replay holds the row, and its client stands still
			defer resume()  // before the pools' cleanups, which wait for the stalled client

			// The server ends the idle session, and its lock with it.
			require.Eventually(t, func() bool {
				return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database()`) == 0
			}, 20*time.Second, 20*time.Millisecond, "the stalled replay's session stays idle in its transaction")
			resume()
			require.Error(t, <-done, "the replay's session was ended")
			require.Zero(t, count(t, pool, `SELECT count(*) FROM outbox WHERE status <> 'dead'`), "nothing of it committed")
		})
	}
}
