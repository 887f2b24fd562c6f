package proccpu

import "time"

// Sample is the CPU time each process of a tree had used at one moment.
type Sample struct {
	ticks map[process]int64
}

// process names one process for its whole life: a pid may be reused once it exits.
type process struct {
	pid     int
	started int64 // in clock ticks after boot
}

// Total returns the CPU time the sampled processes had used.
func (s Sample) Total() time.Duration {
	var ticks int64
	for _, t := range s.ticks {
		ticks += t
	}
	return ticksToDuration(ticks)
}

// Since returns the CPU time used between earlier and s by the processes running at
// s: a process started meanwhile counts whole, and one that exited meanwhile counts
// nothing, neither its last stretch (lost, a little less is reported than was used)
// nor what it had used before earlier (which a difference of totals would take away).
func (s Sample) Since(earlier Sample) time.Duration {
	var ticks int64
	for p, t := range s.ticks {
		ticks += t - earlier.ticks[p]
	}
	return ticksToDuration(ticks)
}

// userHZ is the unit of the CPU times in /proc/<pid>/stat: 100 per second on Linux.
const userHZ = 100

func ticksToDuration(ticks int64) time.Duration {
	return time.Duration(ticks) * time.Second / userHZ
}
