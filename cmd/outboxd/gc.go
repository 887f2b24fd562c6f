package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// A relay process keeps little memory live (the rows it holds claimed, bounded by
// OUTBOX_MAX_CLAIMED_BYTES, and its connections' buffers) while every delivery allocates
// a little. With Go's default GOGC=100 the garbage collector runs after every few
// megabytes allocated, and took 10–15 µs of CPU per delivery in `outboxd bench`. So a
// process that runs a relay (`serve`, and `bench` to measure what serve does) lets the
// heap grow to five times what is live, GOGC=400, under a soft memory limit
// (GOMEMLIMIT) that keeps it bounded when much is live: twice OUTBOX_MAX_CLAIMED_BYTES
// plus 256 MiB, or three quarters of the container's (cgroup's) memory limit, else of the
// machine's memory, when that is less. Near the limit the collector runs as often as it
// must. An operator who sets GOGC or GOMEMLIMIT decides both: outboxd then leaves the
// runtime as the environment set it.
const (
	relayGOGC       = 400
	relayGCHeadroom = 256 << 20 // the soft limit's allowance beyond the claimed payloads
)

// gcPlan is how a relay process sets the garbage collector.
type gcPlan struct {
	fromEnv bool  // GOGC or GOMEMLIMIT is set: leave the runtime as it is
	percent int   // GOGC
	limit   int64 // GOMEMLIMIT, in bytes
}

// planGC decides the collector's settings for a relay whose claimed payloads are bounded
// by maxClaimed bytes. getenv reads the process environment; memory returns the memory
// the process may use (the container's limit, or the machine's), or an error when
// unknown.
func planGC(getenv func(string) string, maxClaimed int64, memory memlimit.Provider) gcPlan {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return gcPlan{fromEnv: true}
	}
	limit := int64(math.MaxInt64)
	if maxClaimed >= 0 && maxClaimed <= (math.MaxInt64-relayGCHeadroom)/2 {
		limit = 2*maxClaimed + relayGCHeadroom
	}
	if total, err := memory(); err == nil && total > 0 {
		if share := total / 4 * 3; share < uint64(limit) {
			limit = int64(share)
		}
	}
	return gcPlan{percent: relayGOGC, limit: limit}
}

// tuneGC applies planGC when this command owns its process, and describes the
// collector's settings as the runtime now has them.
func (e *env) tuneGC(maxClaimed int64) string {
	if e.ownsProcess {
		p := planGC(os.Getenv, maxClaimed, memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem))
		if !p.fromEnv {
			debug.SetGCPercent(p.percent)
			debug.SetMemoryLimit(p.limit)
		}
	}
	return describeGC()
}

// describeGC reads the runtime's GOGC and GOMEMLIMIT, e.g. "GOGC=400 GOMEMLIMIT=512MiB".
func describeGC() string {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	return formatGC(s[0].Value.Uint64(), s[1].Value.Uint64())
}

// formatGC writes GOGC and GOMEMLIMIT as the environment would set them. The runtime
// reports GOGC=off as 0, and no memory limit as the largest int64.
func formatGC(percent, limit uint64) string {
	gogc := "off"
	if percent > 0 {
		gogc = fmt.Sprint(percent)
	}
	memLimit := "off"
	switch {
	case limit >= math.MaxInt64:
	case limit%(1<<30) == 0:
		memLimit = fmt.Sprintf("%dGiB", limit>>30)
	case limit%(1<<20) == 0:
		memLimit = fmt.Sprintf("%dMiB", limit>>20)
	default:
		memLimit = fmt.Sprintf("%dB", limit)
	}
	return "GOGC=" + gogc + " GOMEMLIMIT=" + memLimit
}
