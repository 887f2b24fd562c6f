//go:build unix

package pgcluster

import "syscall"

// withOwnProcessGroup puts the server in a process group of its own. A terminal's Ctrl-C
// sends SIGINT to the whole foreground process group: in ours, the server would take it
// as a fast shutdown request and go away under the program that started it, whose
// clients (a relay recording its last outcomes, say) would then fail while it stops
// them in order. Stop, or the parent death signal, ends the server instead.
func withOwnProcessGroup(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	if a == nil {
		a = &syscall.SysProcAttr{}
	}
	a.Setpgid = true
	return a
}
