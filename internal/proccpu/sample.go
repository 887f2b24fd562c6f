package proccpu

import "time"

// Sample is the CPU time each process of a tree had used at one moment.
type Sample struct {
	ticks map[process]int64
	// root is the tree's root process, and reaped what the children it reaped (waited
	// for) had used, theirs included: a child's CPU moves there when it exits.
	root   process
	reaped int64
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

// Since returns the CPU time used between earlier and s by the tree's processes: a
// process started meanwhile counts whole, and one that exited meanwhile (a backend,
// a parallel or autovacuum worker) counts what it used after earlier, read from what
// the root reaped, and not what it had used before earlier (which a difference of
// totals would take away). When the root is not the same process in both samples,
// only the processes running at s count.
func (s Sample) Since(earlier Sample) time.Duration {
	var ticks int64
	for p, t := range s.ticks {
		ticks += t - earlier.ticks[p]
	}
	if s.root != (process{}) && s.root == earlier.root {
		// The root's children gone since earlier were reaped by it: all they used is
		// in its reaped children's time now, of which what they had used by earlier
		// is not this window's.
		ticks += s.reaped - earlier.reaped
		for p, t := range earlier.ticks {
			if _, running := s.ticks[p]; !running {
				ticks -= t
			}
		}
	}
	return ticksToDuration(ticks)
}

// userHZ is the unit of the CPU times in /proc/<pid>/stat: 100 per second on Linux.
const userHZ = 100

func ticksToDuration(ticks int64) time.Duration {
	return time.Duration(ticks) * time.Second / userHZ
}
