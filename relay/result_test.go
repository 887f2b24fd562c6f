package relay

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// answerOnce is a connector of an embedder's own: its first attempt fails with the
// receiver's answer, and every later one succeeds with the answer it returns then.
type answerOnce struct {
	calls   atomic.Int32
	success json.RawMessage
}

func (c *answerOnce) Deliver(context.Context, connectors.Delivery) (json.RawMessage, error) {
	if c.calls.Add(1) == 1 {
		return json.RawMessage(`{"status":503,"body":"down for maintenance"}`), errors.New("503 Service Unavailable")
	}
	return c.success, nil
}

func (c *answerOnce) Guarantee() connectors.Guarantee { return connectors.Enforced }

// A delivered row's result is the answer of the attempt that delivered it. When that
// attempt returned none (a nil result, or one that is not JSON), the row kept the failed
// attempt's answer, so a delivered row read as answered "503 down for maintenance".
func TestDeliveredRowKeepsNoEarlierAttemptsAnswer(t *testing.T) {
	t.Parallel()
	for name, success := range map[string]json.RawMessage{"nil": nil, "not JSON": json.RawMessage("OK")} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			b := &testBundle{pool: pool}
			cfg := b.fastConfig()
			cfg.Registerer = nil
			start(t, pool, cfg, map[string]Instance{"webhook": {Connector: &answerOnce{success: success}}})
			enqueue(t, pool, "k", "webhook", map[string]any{"n": 1})
			in := waitStatus(t, pool, "k", outbox.StatusDelivered)
			require.Equal(t, 2, in.Attempts)
			require.Empty(t, string(in.Result), "the delivered row's result is the failed attempt's answer")
		})
	}
}
