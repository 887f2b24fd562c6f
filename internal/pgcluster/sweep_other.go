//go:build !linux

package pgcluster

// markCreator does nothing: only Linux tells a process's start time apart from its pid's
// next owner, and only Linux stops the server with its parent, so only there can a
// directory be known to be abandoned.
func markCreator(string) error { return nil }

// sweepStale does nothing; see markCreator.
func sweepStale(string, func(format string, args ...any)) {}
