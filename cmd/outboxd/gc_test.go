package main

import (
	"errors"
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/stretchr/testify/require"
)

func TestPlanGC(t *testing.T) {
	const MiB = 1 << 20
	noEnv := func(string) string { return "" }
	unknown := func() (uint64, error) { return 0, memlimit.ErrNoLimit }
	for _, tc := range []struct {
		name       string
		env        map[string]string
		maxClaimed int64
		memory     memlimit.Provider
		want       gcPlan
	}{
		{name: "defaults", maxClaimed: 128 * MiB, memory: unknown, want: gcPlan{percent: 400, limit: 512 * MiB}},
		{name: "a large machine does not raise the limit", maxClaimed: 128 * MiB,
			memory: memlimit.Limit(64 << 30), want: gcPlan{percent: 400, limit: 512 * MiB}},
		{name: "a larger bound on claimed payloads raises it", maxClaimed: 1 << 30,
			memory: unknown, want: gcPlan{percent: 400, limit: 2<<30 + 256*MiB}},
		{name: "a small container lowers it to three quarters", maxClaimed: 128 * MiB,
			memory: memlimit.Limit(256 * MiB), want: gcPlan{percent: 400, limit: 192 * MiB}},
		{name: "an unreadable limit is ignored", maxClaimed: 128 * MiB,
			memory: func() (uint64, error) { return 0, errors.New("no cgroup") }, want: gcPlan{percent: 400, limit: 512 * MiB}},
		{name: "a bound too large to double means no limit", maxClaimed: math.MaxInt64,
			memory: unknown, want: gcPlan{percent: 400, limit: math.MaxInt64}},
		{name: "GOGC set by the operator", env: map[string]string{"GOGC": "150"}, maxClaimed: 128 * MiB,
			memory: unknown, want: gcPlan{fromEnv: true}},
		{name: "GOMEMLIMIT set by the operator", env: map[string]string{"GOMEMLIMIT": "1GiB"}, maxClaimed: 128 * MiB,
			memory: unknown, want: gcPlan{fromEnv: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv := noEnv
			if tc.env != nil {
				getenv = func(k string) string { return tc.env[k] }
			}
			require.Equal(t, tc.want, planGC(getenv, tc.maxClaimed, tc.memory))
		})
	}
}

func TestFormatGC(t *testing.T) {
	require.Equal(t, "GOGC=400 GOMEMLIMIT=512MiB", formatGC(400, 512<<20))
	require.Equal(t, "GOGC=100 GOMEMLIMIT=off", formatGC(100, math.MaxInt64))
	require.Equal(t, "GOGC=off GOMEMLIMIT=2GiB", formatGC(0, 2<<30))
	require.Equal(t, "GOGC=50 GOMEMLIMIT=1000B", formatGC(50, 1000))
}

// TestTuneGCLeavesSharedProcessesAlone: a command run beside others (as in these tests)
// does not change the process's collector, and reports it as it is.
func TestTuneGCLeavesSharedProcessesAlone(t *testing.T) {
	before := describeGC()
	got := (&env{}).tuneGC(128 << 20)
	require.Equal(t, before, got)
	require.Equal(t, before, describeGC())

	old := debug.SetGCPercent(250)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	require.Contains(t, (&env{}).tuneGC(128<<20), "GOGC=250 ")
}
