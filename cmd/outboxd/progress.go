package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
)

// progressBar draws "label [#####.....] done/total" on one terminal line. It is drawn
// only when stderr is a terminal; the commands print their results on stdout.
type progressBar struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	drawn bool
}

const progressWidth = 30

func newProgressBar(w io.Writer, label string) *progressBar {
	return &progressBar{w: w, label: label}
}

// set redraws the bar; it suits ops.ReplayOptions.ProgressFunc.
func (p *progressBar) set(done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	filled := progressWidth
	if total > 0 {
		filled = min(progressWidth, done*progressWidth/total)
	}
	fmt.Fprintf(p.w, "\r%s [%s%s] %d/%d", p.label, strings.Repeat("#", filled),
		strings.Repeat(".", progressWidth-filled), done, total)
	p.drawn = true
}

// done ends the bar's line.
func (p *progressBar) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}
