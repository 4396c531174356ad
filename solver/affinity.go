package solver

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/affinity"
	"github.com/moetuner/moetuner/solver/internal/replica"
	"github.com/moetuner/moetuner/solver/internal/task"
	"github.com/moetuner/moetuner/solver/internal/trafficbound"
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

// solveAffinity starts from a balanced plan (the replicated path's packing,
// or the best baseline without replicas) and improves it with the affinity
// search; the better of the two by the cost model is returned.
func solveAffinity(ctx context.Context, p Problem, backend mip.Backend, opts Options, b budget, start time.Time) (*Result, error) {
	sc := p.Scenario()
	slots := p.slotCounts()
	W := int64(opts.Effort) * 1_000_000
	limit := opts.TimeLimit
	res := &Result{Status: StatusFeasible}
	var first *placement.Plan
	var firstRep *costmodel.Report
	var evalTime time.Duration
	if p.replicated() {
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
			return nil, err
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
			return nil, err
		}
		first, firstRep, evalTime = bb.plan, bb.rep, bb.eval
		res.Baseline, res.BaselineObjective = bb.st, bb.obj
	}
	if firstRep == nil {
		t0 := time.Now()
		var err error
		if firstRep, err = sc.Evaluate(first); err != nil {
			return nil, err
		}
		evalTime = time.Since(t0)
		res.BaselineObjective = firstRep.TimeSec
	}
	// What follows the search: evaluating its plan (the facade reuses
	// that report), about as long as one evaluation, and as much again
	// for the layers' last moves and the certificate; and the repair
	// to Problem.MaxImbalance when there is a cap.
	after := 2 + imbalanceEvals(p)
	if p.Split == SplitOptimal {
		// The optimal splits' flows (about one evaluation) and the
		// plan's evaluation after them.
		after += 2
	}
	reserve := time.Duration(after * float64(evalTime))
	if p.replicated() && p.Current == nil && (W > 0 || time.Until(start.Add(limit)) > reserve+4*evalTime) {
		// The packing balances, and under local dispatch spreads copies
		// over nodes for the NICs, which on nodes whose NVLink sets the
		// time can leave it slower than EPLB's plan: start from the
		// faster of the two, when the limit leaves the search as much
		// time again as EPLB's plan and its evaluation take (about two
		// evaluations).
		if bp, err := Baseline(p, StrategyEPLB); err == nil && sameSlots(bp, slots) {
			if r, err := sc.Evaluate(bp); err == nil && r.TimeSec < firstRep.TimeSec {
				first, firstRep = bp, r
				res.Baseline, res.BaselineObjective = StrategyEPLB, r.TimeSec
			}
		}
	}
	report := reporter(opts, start)
	stage := "baseline " + string(res.Baseline)
	if res.Baseline == "packing" {
		stage = "packing"
	}
	report(stage, firstRep.TimeSec, math.NaN())
	// The bound on remote-node copies first, within its share: the home
	// flow's for any plan with these slots, the chain flow's for any plan
	// with one copy of every expert (its bound knows no copies).
	// No bound is known for the dispatches that are not closed forms
	// (SGLang's tables and dynamic dispatch): a particular deal may send
	// fewer copies across nodes than any closed form predicts.
	if (p.Flow == costmodel.FlowHome || !p.replicated()) && (p.Dispatch.Closed() == p.Dispatch || !p.Dispatch.PerSource()) {
		bctx, cancel := ctx, func() {}
		if W == 0 {
			// Its share from now: the start's packing and checks before it
			// take what they take, and a deadline fixed from the solve's
			// start would leave the bound what they left.
			dl := time.Now().Add(of(limit, b.AffinityBound))
			if end := start.Add(limit - reserve); dl.After(end) {
				dl = end
			}
			bctx, cancel = context.WithDeadline(ctx, dl)
		}
		sh := trafficbound.Shape{Nodes: p.Cluster.Nodes, GPUsPerNode: p.Cluster.GPUsPerNode, SlotsPerGPU: slots}
		bo := trafficbound.Options{Parallel: opts.Parallel, ShiftSteps: -1}
		bound := func(o trafficbound.Options) ([]trafficbound.Bound, error) {
			if p.Flow == costmodel.FlowHome {
				return trafficbound.HomeRemoteLayers(bctx, p.Stats, sh, p.Dispatch, o)
			}
			return trafficbound.ChainLayers(bctx, p.Stats, sh, o)
		}
		t0 := time.Now()
		bs, err := bound(bo)
		pass := time.Since(t0)
		// A layer's time in that pass: its wall time over the rounds of
		// Parallel layers it ran.
		layerTime := pass * time.Duration(max(opts.Parallel, 1)) / time.Duration(max(p.Stats.Layers, 1))
		// again bounds the layers once more with o while the share lasts
		// (a pass takes them in order); each layer keeps the larger of
		// its bounds (all hold).
		again := func(o trafficbound.Options) {
			bs2, err2 := bound(o)
			if err2 != nil && !errors.Is(err2, context.DeadlineExceeded) {
				return
			}
			for i := range min(len(bs), len(bs2)) {
				if bs2[i].Method != "" && bs2[i].Value > bs[i].Value {
					bs[i] = bs2[i]
				}
			}
		}
		// With a cap (home flow), a pass over the plans that meet it, as
		// the joint plan will: every layer's busiest GPU at most
		// MaxImbalance times the mean per unit of speed, so a node serves
		// at most its share of the speed times that. It runs with the
		// shift steps and includes the bound over every plan with them,
		// so each layer it reaches is at least what the steps pass gives;
		// but it is dearer. Measured on the 32k trace (4 × 8, 32 slots,
		// static, one core, layers 0, 20, 40): 29 ms a layer for the
		// first pass (0.92 remote nodes per token), 91 ms with the cap
		// (1.15), 165 ms with the cap and the steps (1.27). So when the
		// share holds six first passes it runs alone; else the steps pass
		// over every plan comes first, as without a cap, and the capped
		// pass takes what is left (a layer it does not reach keeps the
		// larger of the others), so a cap never leaves the bound below
		// the one without it.
		capOn := p.Flow == costmodel.FlowHome && p.MaxImbalance > 0
		dl, timed := bctx.Deadline()
		cappedFits := capOn && (W > 0 || timed && time.Until(dl) > 6*pass)
		if timed && err == nil && W == 0 && !cappedFits && time.Until(dl) > 2*layerTime {
			// Every layer is bounded, and the share holds a round of
			// layers with the spectral shift steps (a third more work),
			// twice over: the steps tighten each layer's bound.
			bo.ShiftSteps = 0
			again(bo)
		}
		if capOn && err == nil && bctx.Err() == nil {
			bo.MaxNodeLoad = p.MaxImbalance * nodeSpeedPeak(p.Cluster)
			bo.ShiftSteps = 0
			again(bo)
		}
		cancel()
		// Out of its share (not cancelled): the layers bounded by then
		// still bound the plan, the others counting 0.
		if (err == nil || ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)) && p.Stats.Tokens > 0 {
			v, n, capped := 0.0, 0, false
			for _, bd := range bs {
				if bd.Method != "" {
					v, n, capped = v+bd.Value, n+1, capped || bd.Capped
				}
			}
			if n > 0 {
				res.RemoteBound, res.remoteBound = v/(p.Stats.Tokens*float64(p.Stats.Layers)), true
				res.RemoteBoundLayers = n
				if capped {
					res.RemoteBoundCap = p.MaxImbalance
				}
			}
		}
	}
	ao := affinity.Options{
		Limit:    task.Limit{Deadline: start.Add(limit - reserve), Work: work(W, 1-b.AffinityStart)},
		Parallel: opts.Parallel,
		MinLayer: b.MinLayer,
		Shares:   b.Affinity,
	}
	solve := affinity.Solve
	if p.Flow == costmodel.FlowChain {
		solve = affinity.SolveChain
	}
	ap := affinity.Problem{Scenario: sc, Slots: slots, Start: first, StartReport: firstRep, EvalTime: evalTime}
	if p.Flow == costmodel.FlowHome && p.Split != SplitOptimal && len(p.Workloads) == 0 {
		// The cap as the search can measure it (tokens as dispatched per
		// unit of speed); under an optimal split or workloads the repair
		// alone measures it.
		ap.MaxImbalance = p.MaxImbalance
	}
	if movesBudgeted(p, opts) {
		ap.Current, ap.MaxMoves, ap.MoveCost = p.Current, opts.MaxMoves, p.MoveCost
	}
	ar, err := solve(ctx, ap, ao)
	if err != nil {
		return nil, err
	}
	plan := placement.FromReplicas(p.Cluster.GPUs(), ar.Copies, "joint")
	rep := firstRep
	res.Plan = first
	if !sameCopies(plan, first) {
		// The search moved something: keep it only if the cost model,
		// evaluated on the plan itself, agrees that it is better.
		r, err := sc.Evaluate(plan)
		if err != nil {
			return nil, err
		}
		// Under a move cost the plans are compared with their moves
		// charged, as the search priced them.
		// Under a cap the search's plan may be slower where the start
		// breaks the cap: it is then kept when it leaves fewer layers
		// above the cap (the repair that follows must bring them under).
		over, overFirst := layersOverCap(p, r, ap.MaxImbalance), layersOverCap(p, firstRep, ap.MaxImbalance)
		better := over < overFirst || over == overFirst && r.TimeSec+moveCharge(p, plan) <= firstRep.TimeSec+moveCharge(p, first)
		if better && withinMoves(p, opts, plan) {
			res.Plan, rep = plan, r
		}
	}
	res.report = rep
	report("affinity", rep.TimeSec, math.NaN())
	if W == 0 && time.Now().After(start.Add(limit)) {
		res.Status = StatusTimeLimit
	}
	res.Bound, res.ModelObjective, res.Gap = math.NaN(), math.NaN(), math.NaN()
	if p.replicated() {
		bal, err := balanceOf(p, rep)
		if err != nil {
			return nil, err
		}
		res.Balance = bal
		res.Gap = bal.MaxGap
	}
	res.Note = "affinity search"
	return res, nil
}

// withinMoves reports whether plan changes at most Options.MaxMoves slots
// of p.Current in every layer (always, without a bound).
func withinMoves(p Problem, opts Options, plan *placement.Plan) bool {
	if p.Current == nil || opts.MaxMoves <= 0 {
		return true
	}
	for l := range plan.Layers {
		if placement.ChangedSlots(p.Current.Layers[l], plan.Layers[l]) > opts.MaxMoves {
			return false
		}
	}
	return true
}

// moveCharge is what plan's changed slots against p.Current cost under
// p.MoveCost, in seconds: per layer, MoveCost times the mean GPU's compute
// per changed slot (0 without a running plan or a cost).
func moveCharge(p Problem, plan *placement.Plan) float64 {
	if p.Current == nil || p.MoveCost <= 0 {
		return 0
	}
	sc := p.Scenario()
	sec := 0.0
	for l := range plan.Layers {
		sec += affinity.SlotCharge(sc, p.MoveCost, l) * float64(placement.ChangedSlots(p.Current.Layers[l], plan.Layers[l]))
	}
	return sec
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

// sameCopies reports whether a and b put the same copies of every expert
// on the same GPUs in every layer.
func sameCopies(a, b *placement.Plan) bool {
	if a.GPUs != b.GPUs || len(a.Layers) != len(b.Layers) {
		return false
	}
	for l := range a.Layers {
		x, y := a.ExpertGPUs(l), b.ExpertGPUs(l)
		if len(x) != len(y) {
			return false
		}
		for e := range x {
			gx, gy := slices.Clone(x[e]), slices.Clone(y[e])
			slices.Sort(gx)
			slices.Sort(gy)
			if !slices.Equal(gx, gy) {
				return false
			}
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

// nodeSpeedPeak is the largest node's share of the cluster's speed times
// the node count (1 on equal GPUs).
func nodeSpeedPeak(c costmodel.Cluster) float64 {
	total, peak := 0.0, 0.0
	for B := range c.Nodes {
		s := 0.0
		for i := range c.GPUsPerNode {
			s += c.SpeedOf(B*c.GPUsPerNode + i)
		}
		total += s
		peak = max(peak, s)
	}
	if total <= 0 {
		return 1
	}
	return max(1, peak*float64(c.Nodes)/total)
}
