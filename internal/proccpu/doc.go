// Package proccpu reads the CPU time processes have used, for benchmarks that report
// the cost of a piece of work in CPU per item rather than in wall time, which a shared,
// noisy machine distorts. On systems other than Linux nothing is measured and every
// reading says so.
package proccpu
