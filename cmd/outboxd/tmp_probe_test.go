package main

import (
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

func TestProbeMany(t *testing.T) {
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "six-hours", Status: outbox.StatusDead, Age: 6 * time.Hour})
	for _, args := range [][]string{
		{"inspect", "a\xffb"},
		{"inspect", "a\x00b"},
		{"list", "--key-prefix", "a\xffb"},
		{"list", "--ordering-key", "a\x00b"},
		{"list", "--error-contains", "\xff"},
	} {
		code, out, errOut := d.cli(t, "", args...)
		t.Logf("%q => code %d\nOUT:\n%s\nERR:\n%s", args, code, out, errOut)
	}
}
