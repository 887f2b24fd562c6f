//go:build !unix

package pgcluster

import "syscall"

// withOwnProcessGroup returns a unchanged: process groups are a Unix thing.
func withOwnProcessGroup(a *syscall.SysProcAttr) *syscall.SysProcAttr { return a }
