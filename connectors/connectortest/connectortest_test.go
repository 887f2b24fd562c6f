package connectortest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
)

// reconciling is an in-memory connector with the reconciled guarantee: its "receiver"
// does not dedupe, so on every attempt after the first it looks for the effect before
// acting (an ambiguous attempt's mark is gone once a later attempt fails plainly).
// It exercises the suite's reconciled branch, which no real connector uses yet.
type reconciling struct {
	mu      sync.Mutex
	effects map[string]int
	drop    map[string]bool
}

func (c *reconciling) Guarantee() connectors.Guarantee { return connectors.Reconciled }

func (c *reconciling) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("deliver: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if (d.Attempt > 1 || d.PreviousAmbiguous) && c.effects[d.Key] > 0 {
		return json.RawMessage(`{"found":true}`), nil
	}
	c.effects[d.Key]++
	if c.drop[d.Key] {
		delete(c.drop, d.Key)
		return nil, connectors.Ambiguous(errors.New("deliver: connection dropped after the request was sent"))
	}
	return json.RawMessage(`{"ok":true}`), nil
}

func (c *reconciling) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.effects[key]
}

func (c *reconciling) dropNext(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop[key] = true
}

func TestRun_Reconciled(t *testing.T) {
	t.Parallel()
	c := &reconciling{effects: map[string]int{}, drop: map[string]bool{}}
	connectortest.Run(t, connectortest.Harness{
		Connector:           c,
		PayloadFunc:         func(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)) },
		EffectsFunc:         c.count,
		DropAfterEffectFunc: c.dropNext,
		Concurrency:         10,
	})
}
