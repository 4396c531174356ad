package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// progress shows what a long command is doing, on stderr only. On a
// terminal the running phase has one line, rewritten in place (carriage
// return, at most every redrawEvery) and cleared when the phase ends;
// every finished phase, on a terminal or not, leaves exactly one line
// "moetuner: ...". With --quiet it prints nothing. A nil *progress is
// quiet too.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool // rewrite a live line in place
	off   bool // --quiet: print nothing
	now   func() time.Time
	width int // terminal columns; the live line keeps within them

	live  *phase    // the phase the live line shows; nil: none
	shown int       // columns of the live line now on screen; 0: none
	drawn time.Time // when the live line was last drawn

	stop, stopped chan struct{} // the ticker that redraws the live line
}

// startProgress makes a command's progress once its flags are parsed,
// and returns stdout and stderr wrapped so that what the command prints
// never lands inside the live line. Call close before returning.
func startProgress(stdout, stderr io.Writer, quiet bool) (*progress, io.Writer, io.Writer) {
	p := newProgress(stderr, quiet)
	return p, p.writer(stdout), p.writer(stderr)
}

// redrawEvery is the least time between two draws of the live line.
const redrawEvery = 100 * time.Millisecond

// newProgress reports on stderr: in place when stderr is a terminal,
// nothing when quiet. close ends it.
func newProgress(stderr io.Writer, quiet bool) *progress {
	p := newRenderer(stderr, !quiet && isTerminal(stderr), quiet, time.Now, termWidth())
	if p.tty {
		p.stop, p.stopped = make(chan struct{}), make(chan struct{})
		go p.tick()
	}
	return p
}

// newRenderer is newProgress with the terminal, the clock and the width
// given, and no ticker (tests call redraw).
func newRenderer(w io.Writer, tty, quiet bool, now func() time.Time, width int) *progress {
	return &progress{w: w, tty: tty && !quiet, off: quiet, now: now, width: max(width, 20)}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// termWidth is $COLUMNS, else 80.
func termWidth() int {
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return 80
}

func (p *progress) enabled() bool { return p != nil && !p.off }

// tick redraws the live line so that its clock moves between reports.
func (p *progress) tick() {
	t := time.NewTicker(redrawEvery)
	defer t.Stop()
	defer close(p.stopped)
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.redraw()
		}
	}
}

// redraw draws the live line when it is due.
func (p *progress) redraw() {
	if !p.enabled() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drawLocked(false)
}

// close stops the ticker and clears the live line; call it before the
// command returns.
func (p *progress) close() {
	if !p.enabled() {
		return
	}
	if p.stop != nil {
		close(p.stop)
		<-p.stopped
		p.stop = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	p.live = nil
}

// writer returns w, which clears the live line before every write so that
// nothing else printed to the terminal lands inside it.
func (p *progress) writer(w io.Writer) io.Writer {
	if !p.enabled() || !p.tty {
		return w
	}
	return clearingWriter{p: p, w: w}
}

type clearingWriter struct {
	p *progress
	w io.Writer
}

func (c clearingWriter) Write(b []byte) (int, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.clearLocked()
	return c.w.Write(b)
}

// drawLocked draws the live line, at most every redrawEvery unless force.
func (p *progress) drawLocked(force bool) {
	if !p.tty || p.live == nil {
		return
	}
	t := p.now()
	if !force && !p.drawn.IsZero() && t.Sub(p.drawn) < redrawEvery {
		return
	}
	ph := p.live
	text := "moetuner: " + ph.name
	if ph.status != "" {
		text += ": " + ph.status
	}
	// The clock stays in view: what does not fit goes before it.
	clock := " [" + short(t.Sub(ph.start)) + "]"
	text = truncate(text, p.width-1-utf8.RuneCountInString(clock)) + clock
	n := utf8.RuneCountInString(text)
	io.WriteString(p.w, "\r"+text+strings.Repeat(" ", max(p.shown-n, 0)))
	p.shown, p.drawn = n, t
}

// clearLocked blanks the live line and returns the cursor to its start.
func (p *progress) clearLocked() {
	if p.shown > 0 {
		io.WriteString(p.w, "\r"+strings.Repeat(" ", p.shown)+"\r")
		p.shown = 0
	}
}

// printLocked prints "moetuner: text" as a line of its own and draws the
// live line again below it.
func (p *progress) printLocked(text string) {
	p.clearLocked()
	io.WriteString(p.w, "moetuner: "+text+"\n")
	p.drawLocked(true)
}

// truncate cuts s to at most n runes, marking the cut with "…".
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// phase is one step of a command that progress follows: reading the
// traces, one solve, the replay, one backtest policy.
type phase struct {
	p      *progress
	name   string // what the live line calls it
	start  time.Time
	status string
	ended  bool
}

// begin starts a phase; on a terminal its live line replaces the last
// one. A quiet progress returns nil, on which every method does nothing.
func (p *progress) begin(name string) *phase {
	if !p.enabled() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ph := &phase{p: p, name: name, start: p.now()}
	p.live = ph
	p.drawLocked(false)
	return ph
}

// elapsed is the time since the phase began.
func (ph *phase) elapsed() time.Duration {
	if ph == nil {
		return 0
	}
	return ph.p.now().Sub(ph.start)
}

// update sets what the live line says and draws it when due.
func (ph *phase) update(status string) {
	if ph == nil {
		return
	}
	p := ph.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if ph.ended {
		return
	}
	ph.status = status
	if p.live == ph {
		p.drawLocked(false)
	}
}

// line prints "moetuner: text", a finished step within the phase, as its
// own line; the phase goes on, its live line saying status.
func (ph *phase) line(text, status string) {
	if ph == nil {
		return
	}
	ph.p.mu.Lock()
	defer ph.p.mu.Unlock()
	if ph.ended {
		return
	}
	ph.status = status
	ph.p.printLocked(text)
}

// end finishes the phase: its live line goes, and "moetuner: text" is
// its one line ("" prints none: the phase failed and the error says so).
// A second end does nothing.
func (ph *phase) end(text string) {
	if ph == nil {
		return
	}
	p := ph.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if ph.ended {
		return
	}
	ph.ended = true
	if p.live == ph {
		p.clearLocked()
		p.live = nil
	}
	if text != "" {
		io.WriteString(p.w, "moetuner: "+text+"\n")
	}
}

// short formats a duration for progress lines: 850ms, 2.1s, 3m05s, 1h02m.
func short(d time.Duration) string {
	switch {
	case d < 0:
		return "0ms"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		s := int(d.Round(time.Second).Seconds())
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	}
	m := int(d.Round(time.Minute).Minutes())
	return fmt.Sprintf("%dh%02dm", m/60, m%60)
}

// rate formats n per second with an SI prefix: 950, 31.2k, 1.50M.
func rate(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fG", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fk", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}

// eta is how long the rest of total takes at the pace that done of it
// took elapsed; false when nothing is known yet (no bytes, no time, no
// total).
func eta(done, total int64, elapsed time.Duration) (time.Duration, bool) {
	if done <= 0 || total <= 0 || elapsed <= 0 {
		return 0, false
	}
	if done >= total {
		return 0, true
	}
	return time.Duration(float64(elapsed) * float64(total-done) / float64(done)), true
}

// perSecond is n over d, or 0 for no time.
func perSecond(n float64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return n / d.Seconds()
}
