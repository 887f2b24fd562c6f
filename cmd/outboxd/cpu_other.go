//go:build !linux

package main

import "time"

// processCPU is measured on Linux only.
func processCPU() (time.Duration, bool) { return 0, false }

// treeCPU is measured on Linux only.
func treeCPU(int) (time.Duration, bool) { return 0, false }
