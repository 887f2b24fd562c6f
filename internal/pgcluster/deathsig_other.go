//go:build !linux

package pgcluster

import "syscall"

// withParentDeathSignal returns a unchanged: only Linux can tie the server's life to
// ours, so elsewhere a process killed without calling Stop leaves its server running.
func withParentDeathSignal(a *syscall.SysProcAttr) *syscall.SysProcAttr { return a }
