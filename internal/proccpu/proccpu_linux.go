package proccpu

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Self returns the CPU time (user and system) this process has used so far.
func Self() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// treeTries bounds the readings of a tree that a child's reaping made inconsistent.
const treeTries = 10

// Tree returns the CPU time used so far by process pid and each of its children that
// is running, and whether pid itself was found: for a postmaster, the server's
// backends and background processes. It also holds what pid's children that it has
// reaped used (cutime and cstime), so that [Sample.Since] counts a child that exited
// between two samples.
func Tree(pid int) (Sample, bool) {
	if pid <= 0 {
		return Sample{ticks: map[process]int64{}}, false
	}
	for try := 1; ; try++ {
		s, found, consistent := readTree(pid)
		if consistent || !found || try == treeTries {
			return s, found
		}
	}
}

// readTree reads pid's tree once. It is consistent unless a child was reaped while it
// read: the child's CPU may then be counted both in its own entry and in pid's reaped
// children's, or in neither.
func readTree(pid int) (s Sample, found, consistent bool) {
	s = Sample{ticks: map[process]int64{}}
	rootBefore, ok := readStat(fmt.Sprintf("/proc/%d/stat", pid))
	if !ok {
		return s, false, true
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return s, false, true
	}
	consistent = true
	for _, path := range stats {
		st, ok := readStat(path)
		if !ok {
			continue // exited meanwhile
		}
		switch {
		case st.pid == pid:
			s.ticks[process{st.pid, st.started}] = st.own
			s.root = process{st.pid, st.started}
			found = true
		case st.ppid == pid:
			// Being reaped: its times may be in pid's reaped children already.
			if st.state == "X" || st.state == "x" {
				consistent = false
			}
			s.ticks[process{st.pid, st.started}] = st.own + st.reaped
		}
	}
	rootAfter, ok := readStat(fmt.Sprintf("/proc/%d/stat", pid))
	if !ok || rootAfter.started != rootBefore.started {
		return s, false, true
	}
	s.reaped = rootAfter.reaped
	return s, found, consistent && rootAfter.reaped == rootBefore.reaped
}

// stat is what readStat reads of a /proc/<pid>/stat file.
type stat struct {
	pid, ppid int
	state     string
	own       int64 // utime + stime, in ticks
	reaped    int64 // cutime + cstime: the children it waited for, in ticks
	started   int64 // in ticks after boot
}

func readStat(path string) (stat, bool) {
	var st stat
	b, err := os.ReadFile(path)
	if err != nil {
		return st, false
	}
	// pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17) ...
	// starttime(22): comm may hold spaces, so the fields are counted from its closing
	// parenthesis.
	end := bytes.LastIndexByte(b, ')')
	open := bytes.IndexByte(b, '(')
	if end < 0 || open < 0 || open > end {
		return st, false
	}
	st.pid, _ = strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	f := bytes.Fields(b[end+1:])
	if len(f) < 20 {
		return st, false
	}
	st.state = string(f[0])
	st.ppid, _ = strconv.Atoi(string(f[1]))
	utime, _ := strconv.ParseInt(string(f[11]), 10, 64)
	stime, _ := strconv.ParseInt(string(f[12]), 10, 64)
	cutime, _ := strconv.ParseInt(string(f[13]), 10, 64)
	cstime, _ := strconv.ParseInt(string(f[14]), 10, 64)
	st.started, _ = strconv.ParseInt(string(f[19]), 10, 64)
	st.own, st.reaped = utime+stime, cutime+cstime
	return st, true
}
