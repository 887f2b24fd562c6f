package proccpu

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The CPU a process tree used is read from /proc: this process's own, after it burned
// some, counts in both measures.
func TestCPUMeasures(t *testing.T) {
	self0, ok := Self()
	require.True(t, ok)
	tree0, found := Tree(os.Getpid())
	require.True(t, found)
	burn := 0
	for self, _ := Self(); self-self0 < 100*time.Millisecond; self, _ = Self() {
		for i := range 100000 {
			burn += i
		}
	}
	tree1, found := Tree(os.Getpid())
	require.True(t, found)
	require.GreaterOrEqual(t, tree1-tree0, 50*time.Millisecond, "burned %d", burn)
	_, found = Tree(0)
	require.False(t, found)
}
