package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A usage error points at the help of the command that was called, which lists its
// flags and examples: the hint named the root's help for every command, which lists
// neither, so `outboxd list --olderthan 1h` sent the user to a page without list's flags.
func TestUsageErrorHintNamesTheCommand(t *testing.T) {
	t.Parallel()
	env := []string{"OUTBOX_DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}
	for _, tt := range []struct {
		args []string
		hint string
	}{
		{[]string{"list", "--olderthan", "1h"}, "Run 'outboxd list --help' for usage."},
		{[]string{"inspect"}, "Run 'outboxd inspect --help' for usage."},
		{[]string{"token", "new", "--name", "x"}, "Run 'outboxd token new --help' for usage."},
		{[]string{"token", "neww"}, "Run 'outboxd token --help' for usage."},
		{[]string{"statsu"}, "Run 'outboxd --help' for usage."},
		{[]string{"--bogus"}, "Run 'outboxd --help' for usage."},
		{[]string{"help", "bogus"}, "Run 'outboxd --help' for usage."},
	} {
		code, out, errOut := runCLI(t, env, strings.NewReader(""), tt.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tt.args, errOut)
		require.Empty(t, out, tt.args)
		require.True(t, strings.HasSuffix(errOut, "\n"+tt.hint+"\n"), "%v: %s", tt.args, errOut)
	}
	// A configuration error of serve points at serve's help, which names the README's
	// list of variables.
	code, _, errOut := runCLI(t, []string{"OUTBOX_LEASE=soon"}, strings.NewReader(""), "serve")
	require.Equal(t, exitUsage, code, errOut)
	require.True(t, strings.HasSuffix(errOut, "\nRun 'outboxd serve --help' for usage.\n"), errOut)
}
