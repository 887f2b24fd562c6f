package config

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeListsEveryVariable keeps the README's table of variables true: every
// variable that Load reads has a row there with the default Load uses, and every row
// names a variable that Load reads.
func TestReadmeListsEveryVariable(t *testing.T) {
	t.Parallel()

	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err, "the README lists every variable, so it must exist")
	defaults := readmeDefaults(string(readme))
	read := make(map[string]bool)
	for _, v := range Variables() {
		read[v.Name] = true
		got, ok := defaults[v.Name]
		require.True(t, ok, "README.md's table has no row for %s (default %q): %s", v.Name, v.Default, v.Description)
		if v.Default != "" {
			require.Equal(t, "`"+v.Default+"`", got, "README.md's default for %s", v.Name)
		} else {
			require.NotRegexp(t, "^`[^`]*`$", got, "README.md gives %s a default, which Load does not have", v.Name)
		}
	}
	for name := range defaults {
		require.True(t, read[name], "README.md's table lists %s, which Load does not read", name)
	}
}

// readmeRow is a row of the README's table of variables: | `NAME` | default | meaning |.
var readmeRow = regexp.MustCompile("(?m)^\\| `(OUTBOX_[A-Z0-9_]+)` \\| ([^|]*) \\|")

// readmeDefaults returns the default column of each row of the README's table of
// variables, by variable.
func readmeDefaults(readme string) map[string]string {
	_, table, ok := strings.Cut(readme, "\n| variable | default | meaning |\n")
	if !ok {
		return nil
	}
	table, _, _ = strings.Cut(table, "\n\n")
	out := make(map[string]string)
	for _, m := range readmeRow.FindAllStringSubmatch(table, -1) {
		out[m[1]] = strings.TrimSpace(m[2])
	}
	return out
}
