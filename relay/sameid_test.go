package relay

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

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
