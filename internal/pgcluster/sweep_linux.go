package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// creatorFile, in a cluster directory, names the process that created it: its pid and
// its start time in clock ticks since boot (field 22 of /proc/<pid>/stat), so that a
// reused pid is not taken for the creator.
const creatorFile = "creator"

// namespaceFile, in a cluster directory, names the creator's PID namespace, in which
// alone its pid names it. A file of its own: a sweep of a version that reads only
// creatorFile, from another build sharing the temp directory, compares the whole file
// with the creator's pid and start time.
const namespaceFile = "creator-pid-namespace"

// markCreator writes namespaceFile and then creatorFile into dir, naming this process.
func markCreator(dir string) error {
	id, err := processID(os.Getpid())
	if err != nil {
		return err
	}
	ns, err := pidNamespace()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, namespaceFile), []byte(ns+"\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, creatorFile), []byte(id+"\n"), 0o644)
}

// pidNamespace names this process's PID namespace ("pid:[4026531836]").
func pidNamespace() (string, error) {
	return os.Readlink("/proc/self/ns/pid")
}

// sweepStale removes the cluster directories under base that a dead process left
// behind: a test binary that panicked or timed out, or a demo that was killed, cannot
// call Stop, and its server goes with it (the parent death signal), but its directory
// stays, tens of megabytes each. A directory is stale when its creator is gone and no
// server runs on it; one without a creatorFile or a namespaceFile (being created, or
// from an older version) is left alone, and so is one whose creator ran in another PID
// namespace (a container sharing the temp directory): its pid here names another
// process or none, and its server may listen where this process cannot see it.
func sweepStale(base string, logf func(format string, args ...any)) {
	ns, err := pidNamespace()
	if err != nil {
		return // nothing can be told abandoned
	}
	dirs, _ := filepath.Glob(filepath.Join(base, "outboxd-pg-*"))
	for _, dir := range dirs {
		if b, err := os.ReadFile(filepath.Join(dir, namespaceFile)); err != nil || strings.TrimSpace(string(b)) != ns {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, creatorFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
		if err != nil {
			continue
		}
		if id, err := processID(pid); err == nil && id == strings.TrimSpace(string(b)) {
			continue // its creator runs
		}
		if serverRuns(filepath.Join(dir, "data")) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logf("pgcluster: remove %s, left by a process that is gone: %v", dir, err)
			continue
		}
		logf("pgcluster: removed %s, left by a process that is gone", dir)
	}
}

// serverRuns reports whether dataDir's postmaster.pid names a running process, or a
// port something listens on (a server whose pid we cannot see, from another PID
// namespace sharing the temp directory, say).
func serverRuns(dataDir string) bool {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) // unreadable: assume it runs
	}
	lines := strings.Split(string(b), "\n")
	if pid, err := strconv.Atoi(strings.TrimSpace(lines[0])); err == nil {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			return true
		}
	}
	if len(lines) > 3 {
		if port, err := strconv.Atoi(strings.TrimSpace(lines[3])); err == nil && portTaken(port) {
			return true
		}
	}
	return false
}

// processID returns "<pid> <start time>" for a running process.
func processID(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name, in parentheses, may hold spaces; the fields after it don't.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state), so field 22 (starttime) is fields[19].
	if len(fields) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	return strconv.Itoa(pid) + " " + fields[19], nil
}
