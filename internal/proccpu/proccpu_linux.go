package proccpu

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat: 100 per second on Linux.
const userHZ = 100

// Self returns the CPU time (user and system) this process has used so far.
func Self() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// Tree returns the CPU time used so far by process pid and its children that are
// still running: for a postmaster, the server's backends and background processes. A
// child that has exited since an earlier call no longer counts, so the pool's
// connections, which live through a bench phase, should do the work being measured.
func Tree(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, false
	}
	var ticks int64
	found := false
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ... utime(14) stime(15): comm may hold spaces, so
		// the fields are counted from its closing parenthesis.
		end := bytes.LastIndexByte(b, ')')
		if end < 0 {
			continue
		}
		id, _ := strconv.Atoi(string(bytes.TrimSpace(b[:bytes.IndexByte(b, '(')])))
		f := bytes.Fields(b[end+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		if id != pid && ppid != pid {
			continue
		}
		utime, _ := strconv.ParseInt(string(f[11]), 10, 64)
		stime, _ := strconv.ParseInt(string(f[12]), 10, 64)
		ticks += utime + stime
		found = found || id == pid
	}
	return time.Duration(ticks) * time.Second / userHZ, found
}
