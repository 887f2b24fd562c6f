//go:build !unix

package pgcluster

import (
	"os"
	"syscall"
)

// owner is the OS user the server runs as. Outside Unix the server always runs as the
// current user.
type owner struct{}

func serverOwner() (*owner, error) { return nil, nil }

func (o *owner) sysProcAttr() *syscall.SysProcAttr { return nil }

func (o *owner) chown(string) error { return nil }

func tempBase(*owner) string { return os.TempDir() }
