package relay

import (
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// The queues New allocates stay within the headroom that outboxd serve's soft memory
// limit leaves beyond the claimed payloads (256 MiB), at the most Concurrency and with
// twenty instances. Each instance's queue had room for twenty rounds of deliveries of
// all its workers, 50 MB apiece at this concurrency, though a round brings it at most
// BatchSize rows: 993 MiB of heap for twenty instances before a row was claimed, twice
// serve's default limit of 512 MiB, under which the collector then runs as often as it
// must.
func TestQueuesOfManyInstancesAtMostConcurrencyFitServesMemoryLimit(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	hook := newHook(t, "http://127.0.0.1:1/") // a time limit, so its rows are claimed ahead
	instances := map[string]Instance{}
	for i := range 20 {
		instances[fmt.Sprintf("webhook:i%02d", i)] = Instance{Connector: hook}
	}
	r, err := New(pool, &Config{Concurrency: MaxConcurrency}, instances)
	require.NoError(t, err)

	queued := 0
	for _, inst := range r.instances {
		require.Positive(t, inst.ahead, "%s claims ahead", inst.name)
		require.GreaterOrEqual(t, cap(inst.jobs), inst.limit+inst.ahead, "%s: a claim never waits for room in its queue", inst.name)
		queued += cap(inst.jobs)
	}
	bytes := uintptr(queued)*unsafe.Sizeof(claimed{}) + uintptr(cap(r.results))*unsafe.Sizeof(outcome{})
	require.Less(t, bytes, uintptr(256<<20), "the queues take %d MiB", bytes>>20)
}

// Any BatchSize, up to the largest int, leaves the rows claimed ahead at twenty rounds of
// the workers' deliveries when those are fewer than twenty claims: the bound of twenty
// claims must not overflow (negative, it would make New panic, or the queue too small for
// what the instance may claim, and the claim loop wait on it forever).
func TestHugeBatchSizeLeavesRowsAheadAsTheWorkersMake(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	r, err := New(pool, &Config{BatchSize: math.MaxInt, Concurrency: 8}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	inst := r.instances["webhook"]
	require.Equal(t, aheadRounds*8, inst.ahead)
	require.Equal(t, 8+aheadRounds*8, cap(inst.jobs))
}
