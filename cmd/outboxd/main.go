// Command outboxd is the transactional-outbox relay for PostgreSQL: it serves the relay,
// migrates the schema, and gives operators the commands to see and repair the outbox.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is set with -ldflags "-X main.version=...".
var version = ""

func main() {
	os.Exit(runProcess(os.Args[1:]))
}

// runProcess runs one command line as the whole process: with its environment and
// standard streams, and free to change process-wide settings (see env.tuneGC).
func runProcess(args []string) int {
	return runEnv(context.Background(), args, &env{
		environ: os.Environ(), stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, ownsProcess: true,
	})
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError marks a mistake in how the command was called: exit 2, with a hint.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// loggedError is a failure the command has already logged (as JSON, with
// OUTBOX_LOG_FORMAT=json): exit 1, and nothing more on stderr.
type loggedError struct{ err error }

func (e loggedError) Error() string { return e.err.Error() }
func (e loggedError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// env is what commands read instead of the process environment, so tests can run them
// in parallel.
type env struct {
	environ []string
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
	// ownsProcess is set when the command is the whole process (runProcess), not one of
	// several run side by side in a test.
	ownsProcess bool
}

// run executes one command line and returns the exit code.
func run(ctx context.Context, args, environ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, &env{environ: environ, stdin: stdin, stdout: stdout, stderr: stderr})
}

// runEnv executes one command line in e and returns the exit code.
func runEnv(ctx context.Context, args []string, e *env) int {
	root := newRootCmd(e)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var reported loggedError
	if errors.As(err, &reported) {
		return exitFailure
	}
	fmt.Fprintln(e.stderr, "outboxd:", err)
	var ue usageError
	if errors.As(err, &ue) {
		// The help of the command that was called, whose flags and examples it is
		// about: the root's lists neither. `outboxd help TOPIC` is about the topic,
		// which names no command here.
		path := root.CommandPath()
		if cmd != nil && cmd.Name() != "help" {
			path = cmd.CommandPath()
		}
		fmt.Fprintf(e.stderr, "Run '%s --help' for usage.\n", path)
		return exitUsage
	}
	return exitFailure
}

func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:           "outboxd",
		Short:         "Transactional-outbox relay for PostgreSQL",
		Long:          "outboxd delivers the intents your application writes to the outbox table, exactly once per idempotency key as far as the receiver allows.",
		Version:       buildVersion(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// Before the completion command is added below: it takes its output then.
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.AddCommand(newMigrateCmd(e))
	root.AddCommand(newServeCmd(e))
	root.AddCommand(newDemoCmd(e))
	root.AddCommand(newBenchCmd(e))
	root.AddCommand(newStatusCmd(e))
	root.AddCommand(newListCmd(e))
	root.AddCommand(newInspectCmd(e))
	root.AddCommand(newReplayCmd(e))
	root.AddCommand(newCancelCmd(e))
	root.AddCommand(newPurgeCmd(e))
	root.AddCommand(newEnqueueCmd(e))
	root.AddCommand(newMCPCmd(e))
	root.AddCommand(newApproveCmd(e))
	root.AddCommand(newRejectCmd(e))
	root.AddCommand(newTokenCmd(e))
	// cobra adds its help and completion commands only as it runs, after the loop below
	// gave every command its rules for arguments: added now, they get them as well. The
	// help command's topic must name a command (cobra showed the nearest one's help for
	// any other, and exited 0), and completion's shells take no arguments.
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Args = helpTopic
		case "completion":
			for _, shell := range c.Commands() {
				shell.Args = noArgs
			}
		}
	}
	for _, c := range append([]*cobra.Command{root}, root.Commands()...) {
		switch {
		case c.HasSubCommands():
			// Without Args, cobra reports an unknown subcommand as a plain error
			// (exit 1), or shows the help and exits 0 below the root.
			c.Args = knownSubcommand
			c.SuggestionsMinimumDistance = 2 // what cobra's own message uses
			c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		case c.Args == nil:
			c.Args = noArgs
		}
	}
	return root
}

// knownSubcommand refuses, as a usage error, an argument that names no subcommand of a
// command that has them (cobra finds the known ones before it checks arguments).
func knownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if near := cmd.SuggestionsFor(args[0]); len(near) > 0 {
		return usagef("unknown command %q for %q; did you mean %s?", args[0], cmd.CommandPath(), strings.Join(near, " or "))
	}
	return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
}

// helpTopic refuses, as a usage error, a help topic that names no command.
func helpTopic(cmd *cobra.Command, args []string) error {
	target, rest, err := cmd.Root().Find(args)
	if err != nil {
		return usageError{err}
	}
	return knownSubcommand(target, rest)
}

// noArgs refuses positional arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return "dev"
}
