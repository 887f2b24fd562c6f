package config

import (
	"os"
	"regexp"
	"slices"
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

// TestReadmeNamesOnlyVariablesThatExist keeps the README's prose as true as its table:
// every variable it names anywhere, a named instance's (OUTBOX_WEBHOOK_CRM_URL) and a
// pattern's (OUTBOX_WEBHOOK_<NAME>_SECRET) included, is one that outboxd reads, as serve's
// warning about unknown variables decides it. A reader who sets a name that nothing reads
// gets a warning at best, and the setting they meant stays at its default.
func TestReadmeNamesOnlyVariablesThatExist(t *testing.T) {
	t.Parallel()

	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err, "the README names variables, so it must exist")
	named := readmeVariable.FindAllString(string(readme), -1)
	require.NotEmpty(t, named, "the README names no variable: the pattern no longer finds them")
	for _, written := range named {
		if _, ok := readmeMisspelt[written]; ok {
			require.True(t, slices.Contains(unknownVariables(map[string]string{written: "x"}, nil), written),
				"README.md shows %s as a misspelt name, but outboxd reads it", written)
			continue
		}
		for _, name := range expandReadmeVariable(t, written) {
			require.True(t, readByOutboxd(name), "README.md names %s (written %s), which outboxd does not read", name, written)
		}
	}
}

// readmeVariable matches a variable named in the README, with placeholders such as <NAME>.
var readmeVariable = regexp.MustCompile(`OUTBOX_[A-Z0-9_<>]*[A-Z0-9>]`)

// readmeMisspelt are the names the README shows as what a reader might misspell, for
// serve to warn about.
var readmeMisspelt = map[string]struct{}{"OUTBOX_WEBHOOK_SECERT": {}}

// expandReadmeVariable returns the variables a name written in the README stands for:
// <NAME> is any instance's name (CRM stands in for it), and <KIND> every connector kind.
func expandReadmeVariable(t *testing.T, written string) []string {
	t.Helper()
	names := []string{strings.ReplaceAll(written, "<NAME>", "CRM")}
	if strings.Contains(written, "<KIND>") {
		names = nil
		for _, k := range kinds {
			names = append(names, strings.ReplaceAll(written, "<KIND>", strings.ToUpper(k.name)))
		}
	}
	for _, name := range names {
		require.NotContains(t, name, "<", "README.md names %s with a placeholder this test does not know", written)
	}
	return names
}

// readByOutboxd reports whether outboxd reads name, either as it stands or as the
// variable of a named connector instance (OUTBOX_WEBHOOK_CRM_URL for webhook:crm).
func readByOutboxd(name string) bool {
	environment := map[string]string{name: "x"}
	if len(unknownVariables(environment, nil)) == 0 {
		return true
	}
	for _, k := range kinds {
		for _, s := range k.sections {
			rest, ok := strings.CutPrefix(name, s.prefix)
			if !ok {
				continue
			}
			for _, v := range variablesOf(s.typ, "") {
				instance, ok := strings.CutSuffix(rest, "_"+v.Name)
				if ok && instanceName.MatchString(strings.ToLower(instance)) &&
					len(unknownVariables(environment, map[string][]string{k.name: {strings.ToLower(instance)}})) == 0 {
					return true
				}
			}
		}
	}
	return false
}
