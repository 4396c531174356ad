package solver

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/affinity"
	"github.com/moetuner/moetuner/solver/internal/affinitypath"
	"github.com/moetuner/moetuner/solver/internal/replica"
)

// useAffinity reports whether the joint strategy runs the production-scale
// affinity search (see the package doc): the home flow on several nodes
// with per-token paths, any dispatch (under SplitOptimal the shares are
// chosen after the search, as for every strategy), one workload and no
// expert groups; and either replicas, or a
// single-copy layer too large for the joint ILP (more than EffortMaxCols
// assignment columns, E·G, per layer). A running plan (Current) is
// searched from under a move budget only when it has the problem's slots
// on every GPU; with free moves it is only a plan to beat.
func useAffinity(p Problem, opts Options, b budget) bool {
	s := p.Stats
	if p.Cluster.Nodes < 2 || len(p.Workloads) > 0 || p.ExpertGroups > 0 {
		return false
	}
	if p.Current != nil {
		if !currentFits(p) {
			return false
		}
		if !movesBudgeted(p, opts) {
			p.Current = nil
		}
	}
	switch p.Flow {
	case costmodel.FlowHome:
		if s.Patterns == nil {
			return false
		}
	case costmodel.FlowChain:
		if s.Patterns == nil && s.Transitions == nil {
			return false
		}
	}
	return p.replicated() || s.Experts*p.Cluster.GPUs() > b.EffortMaxCols
}

// movesBudgeted reports whether p's running plan bounds or prices the
// moves (Options.MaxMoves, Problem.MoveCost).
func movesBudgeted(p Problem, opts Options) bool {
	return p.Current != nil && (opts.MaxMoves > 0 || p.MoveCost > 0)
}

// currentFits reports whether p.Current has p's layers, GPUs and slots per
// GPU in every layer.
func currentFits(p Problem) bool {
	c := p.Current
	if c == nil || c.GPUs != p.Cluster.GPUs() || len(c.Layers) != p.Stats.Layers || c.Experts != p.Stats.Experts {
		return false
	}
	want := p.slotCounts()
	for l := range c.Layers {
		if !slices.Equal(c.SlotsPerGPU(l), want) {
			return false
		}
	}
	return true
}

// solveAffinity starts from a balanced plan (affinityStart) and improves
// it with the affinity search's pipeline (affinitypath); the better of
// the two by the cost model is returned.
func solveAffinity(ctx context.Context, p Problem, backend mip.Backend, opts Options, b budget, start time.Time) (*Result, error) {
	W := int64(opts.Effort) * 1_000_000
	limit := opts.TimeLimit
	res := &Result{Status: StatusFeasible}
	var eplb *placement.Plan
	var eplbRep *costmodel.Report
	if W == 0 && p.replicated() && p.Current == nil {
		// Under a deadline, EPLB's plan (milliseconds) is scored first:
		// when the time left is short for the packing too, the search
		// starts from it.
		t0 := time.Now()
		if eplb, eplbRep = scoredEPLB(p); eplbRep != nil {
			evalTime := time.Since(t0)
			if time.Until(start.Add(limit)) < packingWorth*evalTime {
				res.Baseline, res.BaselineObjective = StrategyEPLB, eplbRep.TimeSec
				return searchAffinity(ctx, p, opts, b, start, res, eplb, eplbRep, evalTime)
			}
		}
	}
	first, firstRep, evalTime, err := affinityStart(ctx, p, backend, opts, b, start, res)
	if err != nil {
		return nil, err
	}
	reserve := time.Duration(b.affinityAfter(p) * float64(evalTime))
	if p.replicated() && p.Current == nil && (W > 0 || time.Until(start.Add(limit)) > reserve+4*evalTime) {
		// The packing balances, and under local dispatch spreads copies
		// over nodes for the NICs, which on nodes whose NVLink sets the
		// time can leave it slower than EPLB's plan: start from the
		// faster of the two, when the limit leaves the search as much
		// time again as EPLB's plan and its evaluation take (about two
		// evaluations).
		if eplbRep == nil {
			eplb, eplbRep = scoredEPLB(p)
		}
		if eplbRep != nil && eplbRep.TimeSec < firstRep.TimeSec {
			first, firstRep = eplb, eplbRep
			res.Baseline, res.BaselineObjective = StrategyEPLB, eplbRep.TimeSec
		}
	}
	return searchAffinity(ctx, p, opts, b, start, res, first, firstRep, evalTime)
}

// scoredEPLB is EPLB's plan of p and its report, or nils when EPLB cannot
// fill p's slots or the plan cannot be scored.
func scoredEPLB(p Problem) (*placement.Plan, *costmodel.Report) {
	bp, err := Baseline(p, StrategyEPLB)
	if err != nil || !sameSlots(bp, p.slotCounts()) {
		return nil, nil
	}
	r, err := p.Scenario().Evaluate(bp)
	if err != nil {
		return nil, nil
	}
	return bp, r
}

// packingWorth is, in evaluations of a plan, the least time left for
// which the affinity search starts from the packing (scored against
// EPLB's plan) rather than from EPLB's plan alone. The packing and its
// evaluation take about three evaluations. Measured on the 32k
// DeepSeek-V3 trace, SGLang's table: on 4 × 8 GPUs with 32 slots (about
// 12 evaluations left at 5 s, 30 at 10 s) the search from EPLB's plan
// sent 2.586–2.592 remote copies per token-layer at 5 s against
// 2.600–2.662 from the packing, and the same at 10 s; on 8 × 8 with 64
// slots (about 10 at 5 s, 23 at 10 s) EPLB's start gave 205.8 ms against
// 209.0 ms at 5 s, the packing 198.8 ms against 199.7 ms at 10 s. The
// crossing lies between 12 and 23 on both shapes.
const packingWorth = 20

// searchAffinity runs the affinity search's pipeline from first (its
// report firstRep, one evaluation taking evalTime) and fills res.
func searchAffinity(ctx context.Context, p Problem, opts Options, b budget, start time.Time, res *Result, first *placement.Plan, firstRep *costmodel.Report, evalTime time.Duration) (*Result, error) {
	W := int64(opts.Effort) * 1_000_000
	limit := opts.TimeLimit
	reserve := time.Duration(b.affinityAfter(p) * float64(evalTime))
	report := reporter(opts, start)
	stage := "baseline " + string(res.Baseline)
	if res.Baseline == "packing" {
		stage = "packing"
	}
	report(stage, firstRep.TimeSec, math.NaN())
	ap := affinitypath.Problem{
		Problem: affinity.Problem{Scenario: p.Scenario(), Slots: p.slotCounts(), Start: first, StartReport: firstRep, EvalTime: evalTime},
		// No bound is known for the dispatches that are not closed forms
		// (SGLang's tables and dynamic dispatch, vLLM's hash counted token
		// by token): a particular deal, or the rows a rank's tokens sit
		// in, may send fewer copies across nodes than any closed form
		// predicts. vLLM's and TensorRT-LLM's expectations are the even
		// split's.
		Bound:    (p.Flow == costmodel.FlowHome || !p.replicated()) && (p.Dispatch.Closed() == p.Dispatch || !p.Scenario().PerSource()),
		BoundCap: p.MaxImbalance,
	}
	if p.Flow == costmodel.FlowHome && p.Split != SplitOptimal && len(p.Workloads) == 0 {
		// The cap as the search can measure it (tokens as dispatched per
		// unit of speed); under an optimal split or workloads the repair
		// alone measures it.
		ap.MaxImbalance = p.MaxImbalance
	}
	if movesBudgeted(p, opts) {
		ap.Current, ap.MaxMoves, ap.MoveCost = p.Current, opts.MaxMoves, p.MoveCost
	}
	pr, err := affinitypath.Run(ctx, ap, affinitypath.Options{
		Start: start, Limit: limit, Work: W, Reserve: reserve,
		StartShare: b.AffinityStart, BoundShare: b.AffinityBound,
		BoundCappedPasses: b.AffinityCappedPasses, BoundStepRounds: b.AffinityStepRounds,
		Parallel: opts.Parallel, MinLayer: b.MinLayer, Shares: b.Affinity,
	})
	if err != nil {
		return nil, err
	}
	res.Plan, res.report = pr.Plan, pr.Report
	if pr.Bounded {
		res.RemoteBound, res.remoteBound = pr.RemoteBound, true
		res.RemoteBoundLayers, res.RemoteBoundCap = pr.RemoteBoundLayers, pr.RemoteBoundCap
	}
	report("affinity", pr.Report.TimeSec, math.NaN())
	if W == 0 && time.Now().After(start.Add(limit)) {
		res.Status = StatusTimeLimit
	}
	res.Bound, res.ModelObjective, res.Gap = math.NaN(), math.NaN(), math.NaN()
	if p.replicated() {
		bal, err := balanceOf(p, pr.Report)
		if err != nil {
			return nil, err
		}
		res.Balance = bal
		res.Gap = bal.MaxGap
	}
	res.Note = "affinity search"
	return res, nil
}

// affinityStart is the affinity search's start (the running plan under a
// move budget, else the replicated path's packing within its share, or
// the best baseline without replicas), its
// report and how long one evaluation took; it sets res's Baseline and
// BaselineObjective.
func affinityStart(ctx context.Context, p Problem, backend mip.Backend, opts Options, b budget, start time.Time, res *Result) (*placement.Plan, *costmodel.Report, time.Duration, error) {
	W := int64(opts.Effort) * 1_000_000
	limit := opts.TimeLimit
	var first *placement.Plan
	var firstRep *costmodel.Report
	var evalTime time.Duration
	if movesBudgeted(p, opts) {
		// From a running plan under a move budget the search starts from
		// the running plan itself. The packing from it (the replicated
		// path's swaps for balance alone) would spend the budget before
		// the search, which weighs balance and copies in one cost, could:
		// on the 32k DeepSeek-V3 trace's first 8192 tokens (4 × 8, 32
		// slots, SGLang's table, EPLB's plan running, 96 moves a layer)
		// remote copies per token-layer went from 2.7151 to 2.6147 in
		// 60 s (layer time 55.45 ms) from the running plan, to 2.6351
		// (55.60 ms) from the packing; in 10 s 2.6576 against 2.6936.
		first = p.Current
		res.Baseline = "current"
	} else if p.replicated() {
		ro := b.Replica
		ro.Start = start
		ro.Deadline = at(start, limit, b.AffinityStart)
		ro.LayerShare = 1
		ro.Parallel = opts.Parallel
		ro.MinLayer = b.MinLayer
		ro.NoPolish = true
		ro.Work = work(W, b.AffinityStart)
		rr, err := replica.Solve(ctx, replicaProblem(p, opts), backend, ro)
		if err != nil {
			return nil, nil, 0, err
		}
		first = rr.Plan
		res.Baseline = "packing"
	} else {
		var dl time.Time
		if W == 0 {
			dl = at(start, limit, b.AffinityStart)
		}
		bb, err := bestBaseline(p, dl)
		if err != nil {
			return nil, nil, 0, err
		}
		first, firstRep, evalTime = bb.plan, bb.rep, bb.eval
		res.Baseline, res.BaselineObjective = bb.st, bb.obj
	}
	if firstRep == nil {
		t0 := time.Now()
		var err error
		if firstRep, err = p.Scenario().Evaluate(first); err != nil {
			return nil, nil, 0, err
		}
		evalTime = time.Since(t0)
		res.BaselineObjective = firstRep.TimeSec
	}
	if first == p.Current {
		res.CurrentReport = firstRep
	}
	return first, firstRep, evalTime, nil
}

// sameSlots reports whether every layer of plan has slots[g] slots on
// every GPU g.
func sameSlots(plan *placement.Plan, slots []int) bool {
	for l := range plan.Layers {
		if !slices.Equal(plan.SlotsPerGPU(l), slots) {
			return false
		}
	}
	return true
}

// balanceOf certifies a replicated plan's busiest GPU per layer (rep is
// its report: its tokens over its speed, under the problem's dispatch)
// against the bound max(mean, largest replica).
func balanceOf(p Problem, rep *costmodel.Report) (*BalanceReport, error) {
	mean, bound, err := replica.Bounds(replicaProblem(p, Options{}))
	if err != nil {
		return nil, err
	}
	out := &BalanceReport{}
	for l, lr := range rep.Layers {
		busiest := 0.0
		for g, x := range lr.Tokens {
			busiest = math.Max(busiest, x/p.Cluster.SpeedOf(g))
		}
		lb := LayerBalance{Busiest: busiest, Mean: mean[l], Bound: bound[l]}
		out.Layers = append(out.Layers, lb)
		gap := 0.0
		if lb.Bound > 0 {
			gap = lb.Busiest/lb.Bound - 1
		}
		out.MaxGap = math.Max(out.MaxGap, gap)
		out.MeanGap += gap / float64(len(rep.Layers))
	}
	return out, nil
}
