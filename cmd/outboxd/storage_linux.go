package main

import "syscall"

// Magic numbers of the file systems that keep their files in memory (statfs(2)).
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// volatileStorage names the file system dir is on when that keeps its files in memory,
// where fsync reaches no disk and a commit survives no power loss; "" otherwise, or when
// it cannot tell.
func volatileStorage(dir string) string {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return ""
	}
	switch uint32(fs.Type) {
	case tmpfsMagic:
		return "tmpfs"
	case ramfsMagic:
		return "ramfs"
	}
	return ""
}
