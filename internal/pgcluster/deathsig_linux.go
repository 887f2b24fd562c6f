package pgcluster

import "syscall"

// withParentDeathSignal makes the kernel send the server SIGQUIT (immediate shutdown)
// when this process dies without stopping it. It is set after the switch to the postgres
// user, which would otherwise clear it.
//
// Strictly, the signal follows the OS thread that started the server, not the process.
// Go only ends threads whose goroutine exits while locked to it (runtime.LockOSThread),
// so don't call Start or Restart from such a goroutine.
func withParentDeathSignal(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	if a == nil {
		a = &syscall.SysProcAttr{}
	}
	a.Pdeathsig = syscall.SIGQUIT
	return a
}
