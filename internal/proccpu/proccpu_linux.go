package proccpu

import (
	"bytes"
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

// Tree returns the CPU time used so far by process pid and each of its children that
// is running, and whether pid itself was found: for a postmaster, the server's
// backends and background processes.
func Tree(pid int) (Sample, bool) {
	s := Sample{ticks: map[process]int64{}}
	if pid <= 0 {
		return s, false
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return s, false
	}
	found := false
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ... utime(14) stime(15) ... starttime(22): comm may
		// hold spaces, so the fields are counted from its closing parenthesis.
		end := bytes.LastIndexByte(b, ')')
		if end < 0 {
			continue
		}
		id, _ := strconv.Atoi(string(bytes.TrimSpace(b[:bytes.IndexByte(b, '(')])))
		f := bytes.Fields(b[end+1:])
		if len(f) < 20 {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		if id != pid && ppid != pid {
			continue
		}
		utime, _ := strconv.ParseInt(string(f[11]), 10, 64)
		stime, _ := strconv.ParseInt(string(f[12]), 10, 64)
		started, _ := strconv.ParseInt(string(f[19]), 10, 64)
		s.ticks[process{id, started}] = utime + stime
		found = found || id == pid
	}
	return s, found
}
