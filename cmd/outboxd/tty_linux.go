//go:build linux

package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// isTerminal says whether f is a terminal, as golang.org/x/term does on Linux: the
// terminal ioctl succeeds only on one (not on /dev/null or a pipe).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
