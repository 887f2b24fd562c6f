//go:build !linux

package main

import "os"

// isTerminal says whether f is a character device, which is what a terminal is. It
// also says yes for /dev/null; a prompt then reads end of file and is refused.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
