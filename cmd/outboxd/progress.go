package main

import (
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// isTerminal says whether f is a terminal (not a pipe, a file or /dev/null).
func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// progressBar draws replay progress on one terminal line. It is drawn only when stderr
// is a terminal; the commands print their results on stdout.
type progressBar struct{ bar *progressbar.ProgressBar }

func newProgressBar(w io.Writer, label string) *progressBar {
	return &progressBar{bar: progressbar.NewOptions(-1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(label),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
	)}
}

// set redraws the bar; it suits ops.ReplayOptions.ProgressFunc.
func (p *progressBar) set(done, total int) {
	p.bar.ChangeMax(total)
	_ = p.bar.Set(done)
}

// done ends the bar's line.
func (p *progressBar) done() { _ = p.bar.Finish() }
