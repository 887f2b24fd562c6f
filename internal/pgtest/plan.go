package pgtest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// ScanBuffers returns the shared buffers (hit and read together: a page that left the
// cache counts all the same) of the first node of an EXPLAIN (ANALYZE, BUFFERS) plan,
// given as its lines, whose line contains node, such as "Index Scan using
// outbox_pending_due". It fails the test when the plan has no such node or no buffers
// for it.
func ScanBuffers(t testing.TB, lines []string, node string) int {
	t.Helper()
	for i, line := range lines {
		if !strings.Contains(line, node) {
			continue
		}
		for _, l := range lines[i+1:] {
			_, counts, ok := strings.Cut(l, "Buffers: shared ")
			if !ok {
				continue
			}
			n := 0
			for _, f := range strings.Fields(counts) {
				name, v, _ := strings.Cut(f, "=")
				if name == "hit" || name == "read" {
					k, err := strconv.Atoi(v)
					require.NoError(t, err, l)
					n += k
				}
			}
			return n
		}
	}
	require.Fail(t, "no buffers for "+node, strings.Join(lines, "\n"))
	return 0
}
