package config

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeListsEveryVariable keeps the README's table of variables true: every
// variable that Load reads is named there.
func TestReadmeListsEveryVariable(t *testing.T) {
	t.Parallel()

	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err, "the README lists every variable, so it must exist")
	for _, v := range Variables() {
		// Whole names only: OUTBOX_WEBHOOK_URL must not pass for OUTBOX_WEBHOOK_CRM_URL.
		re := regexp.MustCompile(`\b` + regexp.QuoteMeta(v.Name) + `\b`)
		require.True(t, re.Match(readme), "README.md does not mention %s (default %q): %s", v.Name, v.Default, v.Description)
	}
}
