package cli

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"time"
)

// progress shows how far a long operation is. On a terminal it redraws a
// one-line bar in place (at most every 100 ms) and erases it at the end,
// before the summary; elsewhere (a log, a pipe) it prints a plain line at
// most every interval, and nothing for an operation shorter than that.
type progress struct {
	w        io.Writer
	terminal bool
	label    string        // what is counted, for the plain lines
	interval time.Duration // between plain lines
	now      func() time.Time

	mu    sync.Mutex
	start time.Time
	last  time.Time
}

// progressLineEvery is how often a progress line is printed when the
// output is not a terminal.
const progressLineEvery = 5 * time.Second

func newProgress(w io.Writer, terminal bool, label string) *progress {
	p := &progress{w: w, terminal: terminal, label: label, interval: progressLineEvery, now: time.Now}
	p.start = p.now()
	return p
}

// update reports done of total; safe for concurrent use.
func (p *progress) update(done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if !p.terminal {
		since := p.start
		if p.last.After(since) {
			since = p.last
		}
		if done >= total || now.Sub(since) < p.interval {
			return
		}
		p.last = now
		fmt.Fprintf(p.w, "%s %d of %d (%d%%)\n", p.label, done, total, 100*done/max(total, 1))
		return
	}
	if done < total && now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last = now
	const width = 30
	filled := int(width * done / max(total, 1))
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d", bytes.Repeat([]byte("#"), filled), bytes.Repeat([]byte("."), width-filled), done, total)
	if done >= total {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
