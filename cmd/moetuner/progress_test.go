package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/rebalance"
	"github.com/moetuner/moetuner/replay"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

// progressLine matches the lines progress prints at the end of a phase
// or of a solver stage.
var progressLine = regexp.MustCompile(`(?m)^moetuner: (read|reading|solve|replay|backtest) [^\n]*\n`)

// withoutProgress is stderr without its progress lines.
func withoutProgress(stderr string) string { return progressLine.ReplaceAllString(stderr, "") }

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newFakeClock() (*fakeClock, func() time.Time) {
	c := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	return c, c.now
}

// TestRendererTerminal: on a terminal the live line is drawn with a
// carriage return, padded over what it replaces, redrawn at most every
// 100 ms of the injected clock, cleared before a finished line, and the
// phase leaves exactly its final line. It catches a renderer that draws
// on every report, leaves stale characters behind, or never clears.
func TestRendererTerminal(t *testing.T) {
	clock, now := newFakeClock()
	var w bytes.Buffer
	p := newRenderer(&w, true, false, now, 80)
	ph := p.begin("solve joint")
	assert.Equal(t, "\rmoetuner: solve joint [0ms]", w.String())
	w.Reset()

	clock.add(50 * time.Millisecond)
	ph.update("incumbent 1.000ms")
	assert.Empty(t, w.String(), "50 ms after the last draw: not yet")
	p.redraw()
	assert.Empty(t, w.String(), "the ticker waits too")
	clock.add(60 * time.Millisecond)
	p.redraw()
	assert.Equal(t, "\rmoetuner: solve joint: incumbent 1.000ms [110ms]", w.String(), "the ticker draws what the last update said")
	w.Reset()

	clock.add(100 * time.Millisecond)
	ph.update("x")
	long := "\rmoetuner: solve joint: incumbent 1.000ms [110ms]"
	short := "\rmoetuner: solve joint: x [210ms]"
	assert.Equal(t, short+strings.Repeat(" ", len(long)-len(short)), w.String(), "a shorter line blanks what the longer one left")
	w.Reset()

	clock.add(10 * time.Millisecond)
	ph.line("solve joint: ilp: incumbent 1ms after 0.2s", "incumbent 1ms")
	blank := "\r" + strings.Repeat(" ", len(short)-1) + "\r"
	assert.Equal(t, blank+"moetuner: solve joint: ilp: incumbent 1ms after 0.2s\n"+"\rmoetuner: solve joint: incumbent 1ms [220ms]", w.String(),
		"a finished stage clears the live line, prints its own and draws the live line again")
	w.Reset()

	// What else the command prints clears the live line first.
	fmt.Fprint(p.writer(&w), "note\n")
	assert.Equal(t, "\r"+strings.Repeat(" ", len("moetuner: solve joint: incumbent 1ms [220ms]"))+"\rnote\n", w.String())
	w.Reset()

	clock.add(time.Second)
	ph.end("solve joint: modeled 1ms, status optimal, in 1.2s")
	assert.Equal(t, "moetuner: solve joint: modeled 1ms, status optimal, in 1.2s\n", w.String(), "nothing was on screen to clear")
	w.Reset()
	ph.end("again")
	ph.update("late")
	p.redraw()
	p.close()
	assert.Empty(t, w.String(), "an ended phase prints nothing more")

	// A phase that fails leaves no line; close clears the live one.
	ph = p.begin("reading")
	ph.end("")
	assert.NotContains(t, w.String(), "\n")
	w.Reset()
	clock.add(time.Second)
	p.begin("replay cpu")
	p.close()
	assert.Equal(t, "\rmoetuner: replay cpu [0ms]\r"+strings.Repeat(" ", len("moetuner: replay cpu [0ms]"))+"\r", w.String())
}

// TestRendererKeepsClockInView: a live line longer than the terminal is
// cut before its clock, so it never wraps (a wrapped line cannot be
// rewritten in place).
func TestRendererKeepsClockInView(t *testing.T) {
	clock, now := newFakeClock()
	var w bytes.Buffer
	p := newRenderer(&w, true, false, now, 40)
	p.begin("reading").update(strings.Repeat("x", 100))
	w.Reset()
	clock.add(time.Second)
	p.redraw()
	line := strings.TrimPrefix(w.String(), "\r")
	assert.Equal(t, 39, len([]rune(line)))
	assert.True(t, strings.HasSuffix(line, "xx… [1.0s]"), line)
}

// TestRendererNotTerminal: elsewhere the same phases print only their
// one final line each, and the lines of finished stages; no carriage
// return, no live line. Quiet prints nothing, and a nil progress is quiet.
func TestRendererNotTerminal(t *testing.T) {
	run := func(p *progress, clock *fakeClock) {
		ph := p.begin("solve joint")
		for i := range 30 {
			clock.add(7 * time.Millisecond)
			ph.update("step " + string(rune('a'+i%26)))
			p.redraw()
		}
		ph.line("solve joint: ilp: incumbent 1ms after 0.2s", "incumbent 1ms")
		ph.end("solve joint: modeled 1ms")
		p.begin("reading").end("read t.npy: 1.00MB in 1.0s")
		p.close()
	}
	clock, now := newFakeClock()
	var w bytes.Buffer
	run(newRenderer(&w, false, false, now, 80), clock)
	assert.Equal(t, "moetuner: solve joint: ilp: incumbent 1ms after 0.2s\nmoetuner: solve joint: modeled 1ms\nmoetuner: read t.npy: 1.00MB in 1.0s\n", w.String())

	w.Reset()
	run(newRenderer(&w, true, true, now, 80), clock)
	assert.Empty(t, w.String(), "quiet, even on a terminal")
	var nilp *progress
	run(nilp, clock)
	assert.Nil(t, nilp.begin("x"))
	var out bytes.Buffer
	assert.Same(t, &out, nilp.writer(&out).(*bytes.Buffer))
}

// TestETA: the time left at the pace so far, known once some bytes and
// time have passed and the total is known.
func TestETA(t *testing.T) {
	d, ok := eta(25, 100, 3*time.Second)
	assert.True(t, ok)
	assert.Equal(t, 9*time.Second, d)
	d, ok = eta(100, 100, 3*time.Second)
	assert.True(t, ok)
	assert.Zero(t, d)
	for _, c := range [][3]int64{{0, 100, 1}, {10, 0, 1}, {10, 100, 0}} {
		_, ok := eta(c[0], c[1], time.Duration(c[2])*time.Second)
		assert.False(t, ok, c)
	}
	assert.Equal(t, "t.npy: 25.00MB of 100.00MB (25%), 25.0k tokens/s, ETA 6.0s",
		readStatus(routing.ReadProgress{File: "/data/t.npy", Bytes: 25e6, TotalBytes: 100e6, Tokens: 50000}, 2*time.Second))
	assert.Equal(t, "t.jsonl: 3.00MB", readStatus(routing.ReadProgress{File: "t.jsonl", Bytes: 3e6}, 0), "size unknown, no time yet")
	for d, want := range map[time.Duration]string{850 * time.Millisecond: "850ms", 2100 * time.Millisecond: "2.1s", 185 * time.Second: "3m05s", 62 * time.Minute: "1h02m"} {
		assert.Equal(t, want, short(d))
	}
}

// TestPhaseLines: the one line each kind of phase ends with, from the
// reports the libraries send, on the injected clock.
func TestPhaseLines(t *testing.T) {
	clock, now := newFakeClock()
	var w bytes.Buffer
	p := newRenderer(&w, false, false, now, 80)

	rd := p.reading([]string{"data/t.npy"})
	lo := rd.options(routing.LoadOptions{})
	clock.add(time.Second)
	lo.Progress(routing.ReadProgress{File: "data/t.npy", Bytes: 30e6, TotalBytes: 61e6, Tokens: 32768})
	clock.add(time.Second)
	lo.Progress(routing.ReadProgress{File: "data/t.npy", Bytes: 61e6, TotalBytes: 61e6, Tokens: 65536, Done: true})
	rd.end(&routing.Stats{Tokens: 65536}, nil)

	sp := p.solving(solver.StrategyJoint)
	opts := sp.options(solver.Options{})
	nan := math.NaN()
	opts.Progress(solver.Progress{Stage: "ilp", Objective: 0.002, Bound: 0.0015, ILPModel: true, Elapsed: 300 * time.Millisecond})
	opts.Progress(solver.Progress{Stage: "polish", Objective: 0.0019, Bound: nan, Elapsed: 400 * time.Millisecond})
	sp.end(&solver.Result{Objective: 0.0019, CostBound: 0.0018, CostGap: 0.0019/0.0018 - 1, Gap: 0.1, Status: solver.StatusOptimal, SolveTime: 3200 * time.Millisecond}, nil)
	failed := p.solving(solver.StrategyMoETuner)
	failed.end(nil, os.ErrNotExist)

	rp := p.replaying("cpu", 2, 30)
	co := rp.options(replay.CompareOptions{})
	co.Progress(replay.CompareProgress{Round: 1})
	rp.end(&replay.Comparison{Rounds: 12, Stop: replay.StopResolved, Elapsed: 34500 * time.Millisecond}, nil)

	bt := p.backtesting()
	cfg := bt.options(rebalance.BacktestConfig{})
	clock.add(2 * time.Second)
	for i := range 10 {
		cfg.Step(rebalance.StepProgress{Policy: "eplb/4", Done: i + 1, Steps: 10})
	}
	clock.add(time.Second)
	cfg.Progress(rebalance.PolicyResult{Name: "eplb/4", MeanPAR: 1.25, MovedSlots: 12, Harness: rebalance.HarnessScore{TotalSec: 75.5}, PlannerSec: 0.01})
	bt.end()
	p.close()

	assert.Equal(t, strings.Join([]string{
		"moetuner: read data/t.npy: 61.00MB, 65536 tokens in 2.0s (30.50MB/s, 32.8k tokens/s)",
		"moetuner: solve joint: ilp: ILP model incumbent 2.000ms, bound 1.500ms, gap 25.00% after 300ms",
		"moetuner: solve joint: polish: incumbent 1.900ms after 400ms",
		"moetuner: solve joint: modeled 1.900ms, bound 1.800ms (exact cost model), gap 5.56%, status optimal, in 3.2s",
		"moetuner: replay cpu: 2 plans, 12 rounds, stopped after 34.5s: every difference resolved",
		"moetuner: backtest: first plans made in 2.0s",
		"moetuner: backtest eplb/4: mean PAR 1.2500, 12 slots moved, harness 75.50 s, planner 0.01 s, in 1.0s",
		""}, "\n"), w.String())
}

// TestPlanProgressNotTerminal: plan with stderr not a terminal prints one
// line per phase (the read, each solver stage, the solve's result), every
// one a "moetuner: " line without a carriage return; stdout and the
// --json file hold none of it, and the file parses. --quiet prints
// nothing on stderr, and an error still gets there.
func TestPlanProgressNotTerminal(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	js := filepath.Join(dir, "out.json")
	code, stdout, stderr := runCLI(t, "plan", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--effort", "1", "--out", filepath.Join(dir, "p.json"), "--json", js)
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, stderr, "\r")
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 3, stderr)
	assert.Regexp(t, `^moetuner: read testdata/flame-moe-290m/trace.jsonl: 635.1kB, 1024 tokens in \S+ \(`, lines[0])
	assert.Regexp(t, `^moetuner: solve joint: modeled \S+, bound \S+ \(exact cost model\), gap \d+\.\d\d%, status \S+, in \S+$`, lines[len(lines)-1])
	stages := lines[1 : len(lines)-1]
	require.NotEmpty(t, stages)
	assert.Regexp(t, `^moetuner: solve joint: baseline \S+: incumbent \S+ after \S+$`, stages[0])
	for _, l := range stages {
		assert.Regexp(t, `^moetuner: solve joint: [a-z ]+: (ILP model )?incumbent \S+(, bound \S+)?(, gap \d+\.\d\d%)? after \S+$`, l)
	}
	assert.NotContains(t, stdout, "moetuner:")
	data, err := os.ReadFile(js)
	require.NoError(t, err)
	var v any
	require.NoError(t, json.Unmarshal(data, &v), "the --json file parses")
	assert.NotContains(t, string(data), "incumbent")

	for _, args := range [][]string{
		{"plan", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--strategy", "greedy", "--out", filepath.Join(dir, "q.json")},
		{"stats", "testdata/flame-moe-290m/trace.jsonl"},
		{"eval", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-joint.json"},
		{"compare", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--strategies", "greedy,eplb"},
		{"compare", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--redundant-slots", "8", "--time-limit", "1s"}, // skips moetuner, says so unless quiet
		{"replay", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-joint.json"},
		{"report", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-joint.json", "--out", filepath.Join(dir, "r.html")},
	} {
		code, _, stderr := runCLI(t, args...)
		require.Equal(t, 0, code, stderr)
		assert.Regexp(t, `^moetuner: read `, stderr, args[0])
		code, _, stderr = runCLI(t, append(args, "--quiet")...)
		require.Equal(t, 0, code, stderr)
		assert.Empty(t, stderr, "%v --quiet", args)
	}
	code, _, stderr = runCLI(t, "eval", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", filepath.Join(dir, "missing.json"), "--quiet")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "missing.json")
	assert.NotContains(t, stderr, "moetuner: read ")
}

// TestRendererTickerStops: with the ticker running, reports from the
// command's goroutine and the ticker's draws share the writer safely (run
// with -race), and close stops the ticker and leaves the line cleared.
func TestRendererTickerStops(t *testing.T) {
	var w bytes.Buffer
	p := newRenderer(&w, true, false, time.Now, 80)
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	go p.tick()
	ph := p.begin("solve joint")
	for i := range 1000 {
		ph.update(fmt.Sprintf("incumbent %d", i))
	}
	p.close()
	out := w.String()
	assert.True(t, strings.HasPrefix(out, "\rmoetuner: solve joint [0ms]"), out)
	last := strings.LastIndex(out, "\rmoetuner:")
	assert.Regexp(t, `^\rmoetuner: [^\r]*\r *\r$`, out[last:], "the last thing written clears the last line drawn")
	n := w.Len()
	p.redraw()
	assert.Equal(t, n, w.Len(), "nothing after close")
}
