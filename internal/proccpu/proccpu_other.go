//go:build !linux

package proccpu

import "time"

// Self is measured on Linux only.
func Self() (time.Duration, bool) { return 0, false }

// Tree is measured on Linux only.
func Tree(int) (Sample, bool) { return Sample{}, false }
