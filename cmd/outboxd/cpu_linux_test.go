package main

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The CPU a process tree used is read from /proc: this process's own, after it burned
// some, counts in both measures.
func TestCPUMeasures(t *testing.T) {
	self0, ok := processCPU()
	require.True(t, ok)
	tree0, found := treeCPU(os.Getpid())
	require.True(t, found)
	burn := 0
	for self, _ := processCPU(); self-self0 < 100*time.Millisecond; self, _ = processCPU() {
		for i := range 100000 {
			burn += i
		}
	}
	tree1, found := treeCPU(os.Getpid())
	require.True(t, found)
	require.GreaterOrEqual(t, tree1-tree0, 50*time.Millisecond, "burned %d", burn)
	_, found = treeCPU(0)
	require.False(t, found)
}
