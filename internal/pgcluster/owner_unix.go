//go:build unix

package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// owner is the OS user the server runs as when we are root.
type owner struct {
	uid, gid uint32
}

// serverOwner returns the postgres OS user when the process is root, because initdb and
// postgres refuse to run as root, and nil (run as ourselves) otherwise.
func serverOwner() (*owner, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root: "+
			"need an OS user named postgres to run it as (apt-get install postgresql creates one): %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user: gid %q: %w", u.Gid, err)
	}
	if uid == 0 {
		return nil, errors.New("postgres user: has uid 0, and PostgreSQL refuses to run as root")
	}
	return &owner{uid: uint32(uid), gid: uint32(gid)}, nil
}

// sysProcAttr makes a command run as o. A nil o runs it as ourselves.
func (o *owner) sysProcAttr() *syscall.SysProcAttr {
	if o == nil {
		return nil
	}
	// Groups left empty drops root's supplementary groups instead of keeping them.
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: o.uid, Gid: o.gid}}
}

// chown hands dir to o. A nil o leaves it alone.
func (o *owner) chown(dir string) error {
	if o == nil {
		return nil
	}
	return os.Chown(dir, int(o.uid), int(o.gid))
}

// tempBase returns where to create the cluster directory: os.TempDir(), unless o cannot
// reach it (TMPDIR under /root, say), then /tmp.
func tempBase(o *owner) string {
	base := os.TempDir()
	if o == nil || o.canTraverse(base) {
		return base
	}
	return "/tmp"
}

// canTraverse reports whether o can reach entries under dir: it needs search permission on
// dir and every directory above it.
func (o *owner) canTraverse(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		perm := fi.Mode().Perm()
		switch {
		case st.Uid == o.uid:
			if perm&0o100 == 0 {
				return false
			}
		case st.Gid == o.gid:
			if perm&0o010 == 0 {
				return false
			}
		case perm&0o001 == 0:
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}
