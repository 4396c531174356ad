package rebalance

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

// Policy names a way of keeping the placement up to date in a backtest.
type Policy string

const (
	// PolicyStatic installs one plan (moetuner's, from the first window)
	// and never changes it.
	PolicyStatic Policy = "static"
	// PolicyEPLB re-plans with DeepSeek's EPLB every N steps on the last
	// W steps, as SGLang (--enable-eplb) and vLLM (EPLBConfig) do. The
	// stack runs it itself, so under SGLang's static dispatch
	// (placement.Dispatch.Dealt) its plans carry the algorithm's log2phy
	// (placement.Plan.StackEPLB) and are dealt as init_by_eplb.
	PolicyEPLB Policy = "eplb"
	// PolicyMoETuner re-plans from scratch with moetuner (Budget.Fresh)
	// on the same cadence, its GPUs relabelled to move the fewest copies
	// (Relabel).
	PolicyMoETuner Policy = "moetuner"
	// PolicyRebalance runs the Rebalancer from the static plan and lets
	// it move at most BacktestConfig.MaxMoves slots per layer every N
	// steps.
	PolicyRebalance Policy = "rebalance"
)

// Policies lists every policy in the order a backtest reports them.
var Policies = []Policy{PolicyStatic, PolicyEPLB, PolicyMoETuner, PolicyRebalance}

// ParsePolicy maps a policy's name to it.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("rebalance: unknown policy %q (want static, eplb, moetuner or rebalance)", s)
}

// DefaultEvery is BacktestConfig.Every's default cadence.
const DefaultEvery = 100

// BacktestConfig sets up Backtest. Cluster and Model are required.
type BacktestConfig struct {
	Cluster costmodel.Cluster
	Model   costmodel.Model
	// Dispatch is the stack's dispatch every step is scored under (the
	// zero value: even): PolicyResult.Balance and the modeled times, and
	// the Rebalancer's (Config.Dispatch) under PolicyRebalance. Per-step
	// loads carry no source ranks, so every rank is taken to send an equal
	// share of each expert's tokens. Under SGLang's static tables EPLB's
	// plans are dealt as init_by_eplb (the stack computed them), every
	// other plan as init_by_mapping (a map loaded from a file).
	Dispatch placement.Dispatch
	// RedundantSlots are the slots per layer beyond one per expert.
	RedundantSlots int
	// Every lists the cadences to try: the dynamic policies re-plan every
	// N steps (default {DefaultEvery}).
	Every []int
	// Window is how many of the latest steps a re-plan sees (0: its
	// cadence N).
	Window int
	// FirstWindow is the number of steps before the first plan: every
	// policy installs its first plan at step FirstWindow, made from steps
	// [0, FirstWindow), and only the steps from there on are scored
	// (default Window, else the largest cadence).
	FirstWindow int
	// MaxMoves is the Rebalancer's slot budget per layer and rebalance
	// (0: no bound).
	MaxMoves int
	// Pay makes the Rebalancer keep only moves that pay for their
	// migration before the next rebalance (Budget.Horizon = N).
	Pay bool
	// Decay is the Rebalancer's Config.Decay over its window (0: none).
	Decay float64
	// EPLBGroups > 0 runs EPLB's hierarchical policy with that many expert
	// groups (what SGLang and vLLM pick when the model's groups divide over
	// the nodes); 0 its global policy.
	EPLBGroups int
	// Phases, when set, holds every step's phase (for the Rebalancer's
	// windows).
	Phases []Phase
	// Policies to run (default Policies).
	Policies []Policy
	// Harness parameterises the harness score.
	Harness Harness
	// Solver tunes moetuner's solves; Time bounds each (default
	// DefaultTime).
	Solver solver.Options
	Time   time.Duration
	// Progress, when set, is told when each policy is done.
	Progress func(PolicyResult)
	// Step, when set, is told as each policy scores each step, from the
	// goroutine that called Backtest; it should return quickly.
	Step func(StepProgress)
}

// StepProgress is what BacktestConfig.Step is told: how far a policy
// has come through the scored steps.
type StepProgress struct {
	// Policy is the policy's name, as PolicyResult.Name ("eplb/100").
	Policy string
	// Done of Steps scored steps are scored.
	Done, Steps int
	// Rebalances is how many times the policy has re-planned so far.
	Rebalances int
}

// Event is one plan a policy installs.
type Event struct {
	// Step is the first step the plan is in force.
	Step int
	// Moved[l] is the slots of layer l that change (ChangedSlots) from the
	// plan before; MovedSlots their sum. The first plan moves nothing (it
	// is what the server starts with).
	Moved      []int `json:",omitempty"`
	MovedSlots int
	// BytesMoved is MovedSlots × Model.ExpertBytes(); MigrationSec is
	// MigrationTime from the plan before.
	BytesMoved   int64
	MigrationSec float64
	// PlannerSec is the planner call's wall time.
	PlannerSec float64
	// Plan is the installed plan (its slots aligned with the plan before).
	Plan *placement.Plan `json:"-"`
}

// PolicyResult is one policy's run.
type PolicyResult struct {
	// Name is the policy with its cadence ("eplb/100"), or "static".
	Name   string
	Policy Policy
	// Every and Window are the cadence and window (0 for static).
	Every, Window int
	// PAR[i] is the mean over layers of busiest/mean GPU load at step
	// FirstStep+i under the plan in force; MeanPAR and MaxPAR summarise
	// it.
	PAR             []float64
	MeanPAR, MaxPAR float64
	// Balance[i] is the mean over layers of the busiest GPU's load (per
	// unit of speed) over the mean at step FirstStep+i under the plan in
	// force as BacktestConfig.Dispatch deals it (costmodel's
	// LayerReport.Balance); MeanBalance and MaxBalance summarise it. Under
	// the even dispatch on GPUs of one speed it is PAR.
	Balance                 []float64
	MeanBalance, MaxBalance float64
	// Calls counts planner calls (the first plan's included) and
	// Rebalances the calls after it.
	Calls, Rebalances int
	// MovedSlots, BytesMoved and MigrationSec add up the Events.
	MovedSlots   int
	BytesMoved   int64
	MigrationSec float64
	// Harness is the harness score (transit = MovedSlots).
	Harness HarnessScore
	// StepSec is the modeled time of the scored steps under the plans in
	// force (costmodel.StepTime, home flow, sequential), ModeledSec that
	// plus MigrationSec.
	StepSec, ModeledSec float64
	// PlannerSec is the measured wall time of every planner call.
	PlannerSec float64
	Events     []Event
}

// Recommendation says which policy a backtest favours.
type Recommendation struct {
	// Best is the name of the policy with the lowest harness score, and
	// Every its cadence (0: static).
	Best  string
	Every int
	// StaticEnough: the static plan's harness score is within MarginSec of
	// Best's. MarginSec is twice the standard error of the per-step PAR
	// difference between static and Best, times 60 s: how much of the
	// score gap the steps' noise could explain. 0 without a static run.
	StaticEnough bool
	MarginSec    float64
	// BestModeled is the policy with the lowest moetuner modeled time
	// (ModeledSec: the steps plus migration over the cluster's links),
	// which may differ: the harness prices a changed slot at 900 GB/s and
	// a unit of mean PAR at 60 s whatever the run's length.
	BestModeled string
	// Text says it in a sentence.
	Text string
}

// BacktestResult is every policy's run on one series.
type BacktestResult struct {
	// Steps is the series length, FirstStep the first scored step.
	Steps, FirstStep int
	Harness          Harness
	Policies         []PolicyResult
	Recommendation   Recommendation
}

// Backtest replays steps (steps[s][l][e]: tokens routed to expert e at MoE
// layer l in forward pass s, oldest first) under every policy of cfg and
// scores each: per step the PAR of the plan in force, at every plan change
// the slots and bytes moved, the harness score and moetuner's modeled time
// with migration. Every policy installs its first plan at step FirstStep
// from the steps before it; EPLB's is EPLB's, the others' moetuner's fresh
// plan. Plans change only at FirstStep + k·N. The result is a function of
// the inputs (see the package doc), planner wall times aside.
func Backtest(ctx context.Context, steps [][][]float64, cfg BacktestConfig) (*BacktestResult, error) {
	b, err := newBacktest(steps, cfg)
	if err != nil {
		return nil, err
	}
	return b.run(ctx)
}

type backtest struct {
	cfg    BacktestConfig
	steps  [][][]float64
	every  []int
	t0     int
	slots  []int
	first  map[Policy]firstPlan
	result *BacktestResult
}

type firstPlan struct {
	plan *placement.Plan
	sec  float64
}

func newBacktest(steps [][][]float64, cfg BacktestConfig) (*backtest, error) {
	m := cfg.Model
	if err := cfg.Cluster.Validate(); err != nil {
		return nil, fmt.Errorf("rebalance: backtest: %w", err)
	}
	if m.Layers < 1 || m.Experts < 1 || m.TopK < 1 {
		return nil, fmt.Errorf("rebalance: backtest: BacktestConfig.Model has %d layers, %d experts, top-k %d: set the model of the series", m.Layers, m.Experts, m.TopK)
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("rebalance: backtest: no steps")
	}
	for s, st := range steps {
		if len(st) != m.Layers {
			return nil, fmt.Errorf("rebalance: backtest: step %d has %d layers, the model %d", s, len(st), m.Layers)
		}
		for l, row := range st {
			if len(row) != m.Experts {
				return nil, fmt.Errorf("rebalance: backtest: step %d layer %d has %d experts, the model %d", s, l, len(row), m.Experts)
			}
			for e, v := range row {
				if !(v >= 0) || math.IsInf(v, 1) {
					return nil, fmt.Errorf("rebalance: backtest: step %d: load[%d][%d] = %v: counts must be finite and non-negative", s, l, e, v)
				}
			}
		}
	}
	if cfg.Phases != nil && len(cfg.Phases) != len(steps) {
		return nil, fmt.Errorf("rebalance: backtest: %d phases for %d steps", len(cfg.Phases), len(steps))
	}
	b := &backtest{cfg: cfg, steps: steps, every: slices.Clone(cfg.Every)}
	if len(b.every) == 0 {
		b.every = []int{DefaultEvery}
	}
	for _, n := range b.every {
		if n < 1 {
			return nil, fmt.Errorf("rebalance: backtest: cadence %d: re-plan every N ≥ 1 steps", n)
		}
	}
	if cfg.Window < 0 || cfg.FirstWindow < 0 || cfg.MaxMoves < 0 {
		return nil, fmt.Errorf("rebalance: backtest: Window %d, FirstWindow %d, MaxMoves %d: none may be negative", cfg.Window, cfg.FirstWindow, cfg.MaxMoves)
	}
	b.t0 = cfg.FirstWindow
	if b.t0 == 0 {
		b.t0 = cfg.Window
	}
	if b.t0 == 0 {
		b.t0 = slices.Max(b.every)
	}
	if b.t0 >= len(steps) {
		return nil, fmt.Errorf("rebalance: backtest: the series has %d steps and the first plan needs %d of them (the first window) with at least one step left to score; use a shorter window or cadence", len(steps), b.t0)
	}
	if len(b.cfg.Policies) == 0 {
		b.cfg.Policies = Policies
	}
	init, err := DefaultPlan(m.Layers, m.Experts, cfg.RedundantSlots, cfg.Cluster.GPUs())
	if err != nil {
		return nil, err
	}
	b.slots = init.SlotsPerGPU(0)
	b.cfg.Harness = cfg.Harness.withDefaults()
	b.result = &BacktestResult{Steps: len(steps), FirstStep: b.t0, Harness: b.cfg.Harness}
	return b, nil
}

// window returns the summed load of steps [lo, hi).
func (b *backtest) window(lo, hi int) [][]float64 {
	out := matrix(b.cfg.Model.Layers, b.cfg.Model.Experts)
	for _, st := range b.steps[lo:hi] {
		for l, row := range st {
			for e, v := range row {
				out[l][e] += v
			}
		}
	}
	return out
}

// plan runs a policy's planner on load.
func (b *backtest) plan(ctx context.Context, pol Policy, load [][]float64) (*placement.Plan, float64, error) {
	start := time.Now()
	var plan *placement.Plan
	switch pol {
	case PolicyEPLB:
		var err error
		// The stack runs EPLB itself: under a dealt dispatch its table is
		// built from EPLB's log2phy (init_by_eplb), as compare deals its
		// EPLB rows.
		plan, err = baseline.EPLB(routing.StatsFromLoad(load, b.cfg.Model.TopK), b.cfg.Cluster.GPUs(), baseline.EPLBOptions{
			RedundantSlots: b.cfg.RedundantSlots, Groups: b.cfg.EPLBGroups, Nodes: b.cfg.Cluster.Nodes, FixDuplicates: true,
			StackEPLB: b.cfg.Dispatch.Dealt()})
		if err != nil {
			return nil, 0, err
		}
	default:
		res, err := freshPlan(ctx, load, b.cfg.Cluster, b.cfg.Model, b.cfg.Dispatch, b.slots, b.cfg.Solver, b.cfg.Time)
		if err != nil {
			return nil, 0, err
		}
		plan = res.Plan
	}
	return plan, time.Since(start).Seconds(), nil
}

func (b *backtest) run(ctx context.Context) (*BacktestResult, error) {
	// The first plans: EPLB's, and moetuner's for the others.
	b.first = map[Policy]firstPlan{}
	load := b.window(0, b.t0)
	for _, pol := range []Policy{PolicyEPLB, PolicyStatic} {
		need := slices.Contains(b.cfg.Policies, PolicyEPLB)
		if pol == PolicyStatic { // moetuner's first plan serves the other three
			need = slices.ContainsFunc(b.cfg.Policies, func(p Policy) bool { return p != PolicyEPLB })
		}
		if !need {
			continue
		}
		plan, sec, err := b.plan(ctx, pol, load)
		if err != nil {
			return nil, err
		}
		b.first[pol] = firstPlan{plan, sec}
	}
	for _, pol := range Policies { // in report order
		if !slices.Contains(b.cfg.Policies, pol) {
			continue
		}
		cadences := b.every
		if pol == PolicyStatic {
			cadences = []int{0}
		}
		for _, n := range cadences {
			pr, err := b.runPolicy(ctx, pol, n)
			if err != nil {
				return nil, err
			}
			b.result.Policies = append(b.result.Policies, pr)
			if b.cfg.Progress != nil {
				b.cfg.Progress(pr)
			}
		}
	}
	b.result.Recommendation = recommend(b.result.Policies)
	return b.result, nil
}

func (b *backtest) runPolicy(ctx context.Context, pol Policy, n int) (PolicyResult, error) {
	c, m := b.cfg.Cluster, b.cfg.Model
	w := b.cfg.Window
	if w == 0 {
		w = n
	}
	pr := PolicyResult{Name: string(pol), Policy: pol}
	if pol != PolicyStatic {
		pr.Name, pr.Every, pr.Window = fmt.Sprintf("%s/%d", pol, n), n, w
	}
	fp := b.first[PolicyStatic]
	if pol == PolicyEPLB {
		fp = b.first[PolicyEPLB]
	}
	plan := fp.plan
	pr.Events = []Event{{Step: b.t0, PlannerSec: fp.sec, Plan: plan}}
	var rb *Rebalancer
	if pol == PolicyRebalance {
		var err error
		if rb, err = New(Config{Cluster: c, Model: m, Initial: plan, Window: w, Decay: b.cfg.Decay, Solver: b.cfg.Solver, Dispatch: b.cfg.Dispatch}); err != nil {
			return pr, err
		}
		for s := max(0, b.t0-w); s < b.t0; s++ {
			if err := rb.Observe(Step{Load: b.steps[s], Phase: b.phase(s)}); err != nil {
				return pr, err
			}
		}
	}
	S := len(b.steps)
	inForce := make([]*placement.Plan, S-b.t0)
	pr.PAR = make([]float64, S-b.t0)
	for t := b.t0; t < S; t++ {
		if pol != PolicyStatic && t > b.t0 && (t-b.t0)%n == 0 {
			if err := ctx.Err(); err != nil {
				return pr, err
			}
			var next *placement.Plan
			var sec float64
			var err error
			if rb != nil {
				start := time.Now()
				bud := Budget{MaxMoves: b.cfg.MaxMoves, Time: b.cfg.Time}
				if b.cfg.Pay {
					bud.Horizon = n
				}
				var prop *Proposal
				if prop, err = rb.Propose(ctx, bud); err == nil {
					next = prop.Plan
					err = rb.Install(next)
				}
				sec = time.Since(start).Seconds()
			} else {
				next, sec, err = b.plan(ctx, pol, b.window(max(0, t-w), t))
			}
			if err != nil {
				return pr, fmt.Errorf("rebalance: backtest: %s at step %d: %w", pr.Name, t, err)
			}
			if pol == PolicyMoETuner {
				// A fresh plan numbers its GPUs arbitrarily.
				if next, err = Relabel(plan, next, c); err != nil {
					return pr, err
				}
			}
			ev, err := b.change(plan, next, t, sec)
			if err != nil {
				return pr, err
			}
			pr.Events = append(pr.Events, ev)
			plan = ev.Plan
		}
		inForce[t-b.t0] = plan
		pr.PAR[t-b.t0] = StepPAR(plan, b.steps[t])
		if b.cfg.Step != nil {
			b.cfg.Step(StepProgress{Policy: pr.Name, Done: t - b.t0 + 1, Steps: S - b.t0, Rebalances: len(pr.Events) - 1})
		}
		if rb != nil {
			if err := rb.Observe(Step{Load: b.steps[t], Phase: b.phase(t)}); err != nil {
				return pr, err
			}
		}
	}
	for _, ev := range pr.Events {
		pr.Calls++
		pr.MovedSlots += ev.MovedSlots
		pr.BytesMoved += ev.BytesMoved
		pr.MigrationSec += ev.MigrationSec
		pr.PlannerSec += ev.PlannerSec
	}
	pr.Rebalances = pr.Calls - 1
	for _, v := range pr.PAR {
		pr.MeanPAR += v
		pr.MaxPAR = math.Max(pr.MaxPAR, v)
	}
	pr.MeanPAR /= float64(len(pr.PAR))
	pr.Harness = b.cfg.Harness.Score(pr.MeanPAR, pr.MovedSlots, pr.Calls)
	var err error
	if pr.StepSec, pr.Balance, err = b.stepTime(inForce); err != nil {
		return pr, err
	}
	for _, v := range pr.Balance {
		pr.MeanBalance += v
		pr.MaxBalance = math.Max(pr.MaxBalance, v)
	}
	pr.MeanBalance /= float64(len(pr.Balance))
	pr.ModeledSec = pr.StepSec + pr.MigrationSec
	return pr, nil
}

func (b *backtest) phase(s int) Phase {
	if b.cfg.Phases == nil {
		return PhaseAny
	}
	return b.cfg.Phases[s]
}

// change aligns next with plan and says what switching costs.
func (b *backtest) change(plan, next *placement.Plan, t int, sec float64) (Event, error) {
	next, err := Align(plan, next)
	if err != nil {
		return Event{}, err
	}
	ev := Event{Step: t, PlannerSec: sec, Plan: next}
	if ev.Moved, err = ChangedSlots(plan, next); err != nil {
		return ev, err
	}
	for _, v := range ev.Moved {
		ev.MovedSlots += v
	}
	ev.BytesMoved = int64(ev.MovedSlots) * b.cfg.Model.ExpertBytes()
	ev.MigrationSec, err = MigrationTime(plan, next, b.cfg.Cluster, b.cfg.Model)
	return ev, err
}

// stepTime adds up costmodel.StepTime of every scored step under its plan
// in force, the steps modeled in parallel and summed in order, and returns
// every step's balance as the dispatch deals it (the report's
// MeanBalance).
func (b *backtest) stepTime(inForce []*placement.Plan) (float64, []float64, error) {
	per := make([]float64, len(inForce))
	bal := make([]float64, len(inForce))
	errs := make([]error, len(inForce))
	workers := min(runtime.GOMAXPROCS(0), len(inForce))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(inForce); i += workers {
				var rep *costmodel.Report
				per[i], rep, errs[i] = costmodel.StepEvaluate(inForce[i], b.steps[b.t0+i], b.cfg.Model.TopK, b.cfg.Cluster, b.cfg.Model, costmodel.Options{Dispatch: b.cfg.Dispatch})
				if rep != nil {
					bal[i] = rep.MeanBalance
				}
			}
		}()
	}
	wg.Wait()
	total := 0.0
	for i, v := range per {
		if errs[i] != nil {
			return 0, nil, errs[i]
		}
		total += v
	}
	return total, bal, nil
}

// recommend picks the policy with the lowest harness score, and says a
// static plan is enough when static's score is within the noise margin.
func recommend(ps []PolicyResult) Recommendation {
	if len(ps) == 0 {
		return Recommendation{}
	}
	best, static := 0, -1
	for i, p := range ps {
		if p.Harness.TotalSec < ps[best].Harness.TotalSec {
			best = i
		}
		if p.Policy == PolicyStatic {
			static = i
		}
	}
	r := Recommendation{Best: ps[best].Name, Every: ps[best].Every}
	bm := 0
	for i, p := range ps {
		if p.ModeledSec < ps[bm].ModeledSec {
			bm = i
		}
	}
	r.BestModeled = ps[bm].Name
	if static >= 0 && static != best {
		d := make([]float64, len(ps[best].PAR))
		for i := range d {
			d[i] = ps[static].PAR[i] - ps[best].PAR[i]
		}
		r.MarginSec = 2 * HarnessPARSec * stdErr(d)
		r.StaticEnough = ps[static].Harness.TotalSec-ps[best].Harness.TotalSec <= r.MarginSec
	}
	switch {
	case static == best:
		r.StaticEnough = true
		r.Text = fmt.Sprintf("a static plan is enough: no policy scores better than static's %.2f s", ps[best].Harness.TotalSec)
	case r.StaticEnough:
		r.Text = fmt.Sprintf("a static plan is enough: %s scores %.2f s, static %.2f s, within the %.2f s the steps' noise explains", ps[best].Name, ps[best].Harness.TotalSec, ps[static].Harness.TotalSec, r.MarginSec)
	default:
		r.Text = fmt.Sprintf("rebalance every %d steps with %s: harness score %.2f s", ps[best].Every, ps[best].Policy, ps[best].Harness.TotalSec)
		if static >= 0 {
			r.Text += fmt.Sprintf(" against static's %.2f s (noise margin %.2f s)", ps[static].Harness.TotalSec, r.MarginSec)
		}
	}
	return r
}

// stdErr is the standard error of the mean of d.
func stdErr(d []float64) float64 {
	n := float64(len(d))
	if n < 2 {
		return 0
	}
	mean := 0.0
	for _, v := range d {
		mean += v / n
	}
	ss := 0.0
	for _, v := range d {
		ss += (v - mean) * (v - mean)
	}
	return math.Sqrt(ss / (n - 1) / n)
}
