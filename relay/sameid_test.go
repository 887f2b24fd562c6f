package relay

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// sameIDErrors counts the relay's errors about another relay with its ID.
type sameIDErrors struct{ n *atomic.Int64 }

func (h sameIDErrors) Enabled(context.Context, slog.Level) bool { return true }
func (h sameIDErrors) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h sameIDErrors) WithGroup(string) slog.Handler            { return h }

func (h sameIDErrors) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level == slog.LevelError && strings.Contains(rec.Message, "ANOTHER RELAY USES THIS RELAY'S ID") {
		h.n.Add(1)
	}
	return nil
}

// Two relays started with one OUTBOX_RELAY_ID by mistake (a copied environment) do
// not notice it by themselves: each withdraws the other's words in
// outbox_wake_connectors when it stops, and their attempts read as one relay's. The relay
// that renews its words finds them renewed or withdrawn by the other since its own last
// renewal, and says so loudly; it stays quiet when it alone has its ID, and when another
// relay with another ID has the same instances. The two may have different instances (a
// payment relay and a webhook relay).
func TestRelaysWithOneIDAreReported(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		others []string // the second relay's instances
	}{
		{"SameInstances", []string{"webhook"}},
		{"OtherInstances", []string{"webhook:billing"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			newRelay := func(id string, names []string, errs *atomic.Int64) *Relay {
				t.Helper()
				instances := map[string]Instance{}
				for _, name := range names {
					instances[name] = Instance{Connector: newHook(t, "http://127.0.0.1:1/")}
				}
				r, err := New(pool, &Config{ID: id, Registerer: prometheus.NewRegistry(), Logger: slog.New(sameIDErrors{errs})}, instances)
				require.NoError(t, err)
				return r
			}
			var aErrs, bErrs, cErrs atomic.Int64
			a := newRelay("relay-1", []string{"webhook"}, &aErrs)
			c := newRelay("relay-2", []string{"webhook"}, &cErrs) // another ID, the same instance
			a.seen(t.Context())
			c.seen(t.Context())
			a.seen(t.Context())
			c.seen(t.Context())
			require.Zero(t, aErrs.Load(), "a relay alone with its ID")
			require.Zero(t, cErrs.Load(), "a relay alone with its ID")

			b := newRelay("relay-1", tt.others, &bErrs)
			b.seen(t.Context()) // its first renewal has nothing of its own to compare with
			require.Zero(t, bErrs.Load())
			a.seen(t.Context())
			require.Equal(t, int64(1), aErrs.Load(), "the other relay with its ID renewed its word")
			b.seen(t.Context())
			require.Equal(t, int64(1), bErrs.Load(), "the other relay with its ID renewed its word")

			b.withdraw(t.Context()) // b stops, taking a's words with its own
			a.seen(t.Context())
			require.Equal(t, int64(2), aErrs.Load(), "the other relay with its ID withdrew its word")
			a.seen(t.Context())
			require.Equal(t, int64(2), aErrs.Load(), "no other relay with its ID since")
			require.Zero(t, cErrs.Load())
		})
	}
}

// pauseWords makes it as though relay r last renewed its words in
// outbox_wake_connectors d earlier than it did: its process paused (SIGSTOP, a laptop
// asleep, a VM suspended) for d since that renewal. The database's clock cannot be
// moved, so the words and what the relay remembers of them move back instead.
func pauseWords(t *testing.T, pool *pgxpool.Pool, r *Relay, d time.Duration) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `UPDATE outbox_wake_connectors
		SET seen_until = seen_until - $2::interval, polling_until = polling_until - $2::interval
		WHERE relay_id = $1`, r.ID(), d)
	require.NoError(t, err)
	r.lastSeen.Time = r.lastSeen.Time.Add(-d)
}

// A relay paused for over an hour finds, when it resumes, that another relay's renewal
// deleted its words as a dead relay's: that is not another relay with its ID, which it
// said loudly on every such resume. It says it was away instead, and looks for rows from
// the head of the index (inserts may not have woken it meanwhile). The claim loop may
// have written its words again (polling fast, no seen_until) before its renewal ran.
// Another relay with its ID that renewed the words while it was away is still reported.
func TestPausedRelayIsNotTakenForAnotherWithItsID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		claimed   bool // the claim loop wrote that it polls fast before the renewal
		sharingID bool // another relay with the ID renewed the words meanwhile
	}{
		{"Resumed", false, false},
		{"ResumedAndClaimed", true, false},
		{"AnotherRelayRenewedMeanwhile", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			newRelay := func(id string, logger *slog.Logger) *Relay {
				t.Helper()
				r, err := New(pool, &Config{ID: id, Registerer: prometheus.NewRegistry(), Logger: logger},
					map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
				require.NoError(t, err)
				return r
			}
			var logs logBuffer
			var otherErrs atomic.Int64
			paused := newRelay("relay-1", slog.New(slog.NewJSONHandler(&logs, nil)))
			other := newRelay("relay-2", slog.New(sameIDErrors{&otherErrs}))
			said := func(msg string) int { return strings.Count(logs.String(), msg) }
			const sameID, away = "ANOTHER RELAY USES THIS RELAY'S ID", "did not run for longer than its word"
			paused.seen(t.Context())
			other.seen(t.Context())

			pauseWords(t, pool, paused, seenGoneAfter+time.Minute)
			other.seen(t.Context()) // deletes the paused relay's words as a dead relay's
			require.Empty(t, wakeRows(t, &testBundle{pool: pool}, paused.ID()), "the paused relay's words were deleted")
			if tt.claimed {
				_, err := pool.Exec(t.Context(), pollFastSQL, paused.ID(), []string{"webhook"}, fastPollWindow)
				require.NoError(t, err)
			}
			if tt.sharingID {
				newRelay("relay-1", slog.New(sameIDErrors{&otherErrs})).seen(t.Context())
			}
			paused.rescan.Store(false)
			paused.seen(t.Context())
			if tt.sharingID {
				require.Equal(t, 1, said(sameID), "another relay with its ID renewed its words while it was away: %s", logs.String())
			} else {
				require.Zero(t, said(sameID), "a relay back from a pause is not another relay with its ID: %s", logs.String())
			}
			require.Equal(t, 1, said(away), "the pause is said: %s", logs.String())
			require.True(t, paused.rescan.Load(), "rows inserted while it was away are looked for from the head")

			// Back from its pause, it renews its words as any relay does, and says nothing.
			before := logs.String()
			paused.seen(t.Context())
			require.Equal(t, before, logs.String())
			require.Zero(t, otherErrs.Load())
		})
	}
}
