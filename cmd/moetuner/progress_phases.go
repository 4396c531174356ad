package main

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/moetuner/moetuner/rebalance"
	"github.com/moetuner/moetuner/replay"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

// readPhase follows the reading of the traces: the live line shows the
// file being read, its bytes, tokens/s and the time left; the one line at
// the end what was read.
type readPhase struct {
	ph     *phase
	traces []string
	// The files read so far and their bytes; fileStart is when the file
	// being read began (the end of the one before it).
	files     []string
	bytes     int64
	fileStart time.Duration
}

// reading starts the read phase of traces (the --trace arguments).
func (p *progress) reading(traces []string) *readPhase {
	r := &readPhase{ph: p.begin("reading"), traces: traces}
	var bases []string
	for _, t := range traces {
		bases = append(bases, filepath.Base(t))
	}
	r.ph.update(listNames(bases))
	return r
}

// options sets lo.Progress to report to r when r is shown.
func (r *readPhase) options(lo routing.LoadOptions) routing.LoadOptions {
	if r.ph != nil {
		lo.Progress = r.report
	}
	return lo
}

// report is routing.LoadOptions.Progress.
func (r *readPhase) report(rp routing.ReadProgress) {
	if r.ph == nil {
		return
	}
	now := r.ph.elapsed()
	if rp.Done {
		r.files = append(r.files, rp.File)
		r.bytes += rp.Bytes
		r.fileStart = now
		r.ph.update(fmt.Sprintf("%s, %s (last %s)", plural(len(r.files), "file"), bytesStr(float64(r.bytes)), filepath.Base(rp.File)))
		return
	}
	r.ph.update(readStatus(rp, now-r.fileStart))
}

// readStatus is the live line of a file being read for elapsed: bytes of
// the total, tokens/s and the time left.
func readStatus(rp routing.ReadProgress, elapsed time.Duration) string {
	s := filepath.Base(rp.File) + ": " + bytesStr(float64(rp.Bytes))
	if rp.TotalBytes > 0 {
		s += fmt.Sprintf(" of %s (%.0f%%)", bytesStr(float64(rp.TotalBytes)), 100*float64(rp.Bytes)/float64(rp.TotalBytes))
	}
	if tps := perSecond(float64(rp.Tokens), elapsed); tps > 0 {
		s += ", " + rate(tps) + " tokens/s"
	}
	if left, ok := eta(rp.Bytes, rp.TotalBytes, elapsed); ok {
		s += ", ETA " + short(left)
	}
	return s
}

// end finishes the read phase: "read t.npy: 61.00MB, 65536 tokens in
// 2.1s (29.0MB/s, 31.2k tokens/s)", the tokens those of the statistics
// read; nothing when the read failed.
func (r *readPhase) end(stats *routing.Stats, err error) {
	if r.ph == nil {
		return
	}
	if err != nil || stats == nil {
		r.ph.end("")
		return
	}
	tokens := int64(math.Round(stats.Tokens))
	el := r.ph.elapsed()
	what := listNames(r.traces)
	switch n := len(r.files); {
	case n == 1:
		what = r.files[0]
	case n > 1:
		what = fmt.Sprintf("%d files of %s", n, what)
	}
	s := "read " + what
	if r.bytes > 0 {
		s += ": " + bytesStr(float64(r.bytes))
	}
	switch {
	case tokens > 0 && r.bytes > 0:
		s += fmt.Sprintf(", %d tokens", tokens)
	case tokens > 0:
		s += fmt.Sprintf(": %d tokens", tokens)
	}
	s += " in " + short(el)
	var rates []string
	if bps := perSecond(float64(r.bytes), el); bps > 0 {
		rates = append(rates, bytesStr(bps)+"/s")
	}
	if tps := perSecond(float64(tokens), el); tps > 0 {
		rates = append(rates, rate(tps)+" tokens/s")
	}
	if len(rates) > 0 {
		s += " (" + strings.Join(rates, ", ") + ")"
	}
	r.ph.end(s)
}

// listNames joins up to three names, and says how many more there are.
func listNames(names []string) string {
	if len(names) > 3 {
		return strings.Join(names[:3], ", ") + fmt.Sprintf(" and %d more", len(names)-3)
	}
	return strings.Join(names, ", ")
}

// solvePhase follows one solve: every stage the solver reports leaves a
// line with its incumbent, bound and gap; the live line shows the latest
// and the time; the one line at the end the result.
type solvePhase struct {
	ph   *phase
	name string
}

// solving starts the solve phase of strategy st.
func (p *progress) solving(st solver.Strategy) *solvePhase {
	return &solvePhase{ph: p.begin("solve " + string(st)), name: "solve " + string(st)}
}

// options sets opts.Progress to report to s when s is shown.
func (s *solvePhase) options(opts solver.Options) solver.Options {
	if s.ph != nil {
		opts.Progress = s.report
	}
	return opts
}

// report is solver.Options.Progress.
func (s *solvePhase) report(pr solver.Progress) {
	if s.ph == nil {
		return
	}
	inc := incumbent(pr.Objective, pr.Bound, pr.Gap(), pr.ILPModel)
	s.ph.line(fmt.Sprintf("%s: %s: %s after %s", s.name, pr.Stage, inc, short(pr.Elapsed)), inc)
}

// incumbent says "incumbent X, bound Y, gap Z%", leaving out what is NaN;
// ilp marks values of the joint ILP's model.
func incumbent(obj, bound, gap float64, ilp bool) string {
	s := "incumbent " + fmtSec(obj)
	if ilp {
		s = "ILP model incumbent " + fmtSec(obj)
	}
	if !math.IsNaN(bound) {
		s += ", bound " + fmtSec(bound)
	}
	if !math.IsNaN(gap) {
		s += fmt.Sprintf(", gap %.2f%%", 100*gap)
	}
	return s
}

// end finishes the solve: "solve joint: modeled 1.234ms, bound 1.200ms
// (exact cost model), gap 2.83%, status optimal, in 3.2s"; nothing when it
// failed.
func (s *solvePhase) end(res *solver.Result, err error) {
	if s.ph == nil {
		return
	}
	if err != nil || res == nil {
		s.ph.end("")
		return
	}
	s.ph.end(solveSummary(s.name, res))
}

// solveSummary is the line that ends a solve.
func solveSummary(name string, res *solver.Result) string {
	out := name + ": modeled " + fmtSec(res.Objective)
	switch {
	case !math.IsNaN(res.CostBound):
		out += fmt.Sprintf(", bound %s (exact cost model), gap %.2f%%", fmtSec(res.CostBound), 100*math.Max(0, res.CostGap))
	case !math.IsNaN(res.Gap) && res.Balance != nil:
		out += fmt.Sprintf(", busiest GPU %.2f%% above its bound", 100*res.Gap)
	case !math.IsNaN(res.Gap):
		out += fmt.Sprintf(", ILP gap %.2f%%", 100*res.Gap)
	}
	return out + fmt.Sprintf(", status %s, in %s", res.Status, short(res.SolveTime))
}

// replayPhase follows replay's rounds.
type replayPhase struct {
	ph        *phase
	name      string
	plans     int
	maxRounds int
}

// replaying starts the replay phase of plans plans on backend; maxRounds
// is the most rounds it may run (the live line says "round 5/30").
func (p *progress) replaying(backend string, plans, maxRounds int) *replayPhase {
	name := "replay " + backend
	return &replayPhase{ph: p.begin(name), name: name, plans: plans, maxRounds: maxRounds}
}

// options sets co.Progress to report to r when r is shown.
func (r *replayPhase) options(co replay.CompareOptions) replay.CompareOptions {
	if r.ph != nil {
		co.Progress = r.report
	}
	return co
}

// report is replay.CompareOptions.Progress.
func (r *replayPhase) report(cp replay.CompareProgress) {
	if r.ph == nil {
		return
	}
	s := fmt.Sprintf("round %d/%d", cp.Round, r.maxRounds)
	for j, d := range cp.Diffs {
		s += fmt.Sprintf("; %c vs A tail %s, layer %s", 'B'+j, d.Tail, d.Time)
	}
	r.ph.update(s)
}

// end finishes the replay: "replay cpu: 2 plans, 12 rounds, stopped
// after 34.5s: every difference resolved"; nothing when it failed.
func (r *replayPhase) end(c *replay.Comparison, err error) {
	if r.ph == nil {
		return
	}
	if err != nil || c == nil {
		r.ph.end("")
		return
	}
	r.ph.end(fmt.Sprintf("%s: %s, %s, %s", r.name, plural(r.plans, "plan"), plural(c.Rounds, "round"), stopNote(c)))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// backtestPhase follows a backtest: one phase per policy, whose live line
// shows the steps scored and the rebalances so far.
type backtestPhase struct {
	p    *progress
	ph   *phase
	name string // the policy the live line follows
}

// backtesting starts the backtest; the first plans come first.
func (p *progress) backtesting() *backtestPhase {
	return &backtestPhase{p: p, ph: p.begin("backtest: first plans")}
}

// options sets cfg.Step and cfg.Progress to report to b when b is shown.
func (b *backtestPhase) options(cfg rebalance.BacktestConfig) rebalance.BacktestConfig {
	if b.ph != nil {
		cfg.Step, cfg.Progress = b.step, b.policy
	}
	return cfg
}

// step is rebalance.BacktestConfig.Step.
func (b *backtestPhase) step(sp rebalance.StepProgress) {
	if b.ph == nil {
		return
	}
	if sp.Policy != b.name {
		if b.name == "" {
			b.ph.end("backtest: first plans made in " + short(b.ph.elapsed()))
		}
		b.ph.end("")
		b.name, b.ph = sp.Policy, b.p.begin("backtest "+sp.Policy)
	}
	b.ph.update(fmt.Sprintf("step %d of %d (%.0f%%), %s", sp.Done, sp.Steps, 100*float64(sp.Done)/float64(max(sp.Steps, 1)), plural(sp.Rebalances, "rebalance")))
}

// policy is rebalance.BacktestConfig.Progress: the policy's one line.
func (b *backtestPhase) policy(pr rebalance.PolicyResult) {
	if b.ph == nil {
		return
	}
	b.ph.end(fmt.Sprintf("backtest %s: mean PAR %.4f, %d slots moved, harness %.2f s, planner %.2f s, in %s",
		pr.Name, pr.MeanPAR, pr.MovedSlots, pr.Harness.TotalSec, pr.PlannerSec, short(b.ph.elapsed())))
}

// end finishes the backtest (its policies have printed their lines).
func (b *backtestPhase) end() {
	if b.ph != nil {
		b.ph.end("")
	}
}
