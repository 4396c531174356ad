package solver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/jointilp"
	"github.com/moetuner/moetuner/solver/internal/onenode"
	"github.com/moetuner/moetuner/solver/internal/paper"
	"github.com/moetuner/moetuner/solver/internal/search"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// mipStatus summarises the sub-solves of a strategy.
func mipStatus(t task.Tally) Status {
	switch {
	case t.TimedOut:
		return StatusTimeLimit
	case t.AllOptimal:
		return StatusOptimal
	}
	return StatusFeasible
}

func (res *Result) addSizes(t task.Tally) {
	res.Cols += t.Cols
	res.IntCols += t.Ints
	res.Rows += t.Rows
	res.Nonzeros += t.NNZ
}

// reporter returns the function a strategy calls as each of its stages
// ends: it tells opts.Progress, when set, the stage, its incumbent and
// bound (NaN: none) and the time since start. The stages "ilp" and
// "descent" report the ILP's model.
func reporter(opts Options, start time.Time) func(stage string, obj, bound float64) {
	return func(stage string, obj, bound float64) {
		if opts.Progress != nil {
			opts.Progress(Progress{Stage: stage, Objective: obj, Bound: bound, ILPModel: stage == "ilp" || stage == "descent", Elapsed: time.Since(start)})
		}
	}
}

func mipSettings(opts Options) task.MIPSettings {
	set := task.MIPSettings{RelGap: opts.RelGap, Threads: opts.Threads, Seed: opts.Seed}
	if opts.Effort > 0 {
		set.MaxCols = defaultBudget.EffortMaxCols
	}
	return set
}

// solveJoint runs the joint strategy on a single-copy problem: the joint
// ILP from the best baseline, the chain flow's layer descent, the
// exact-cost polish of the ILP plan and of the baseline, and on one node
// with per-token patterns the exact annealing and the certified bound.
// The time splits are b's.
func solveJoint(ctx context.Context, p Problem, backend mip.Backend, opts Options, b budget, start time.Time) (*Result, error) {
	sc := p.Scenario()
	jm, err := jointilp.New(sc, opts.MaxPairs)
	if err != nil {
		return nil, err
	}
	bb, err := bestBaseline(p, time.Time{})
	if err != nil {
		return nil, err
	}
	baseSt, basePlan, baseObj := bb.st, bb.plan, bb.obj
	report := reporter(opts, start)
	report("baseline "+string(baseSt), baseObj, math.NaN())
	warm := jm.Canonical(jointilp.PlanAssign(basePlan))
	limit := opts.TimeLimit
	if r := time.Duration(imbalanceEvals(p) * float64(bb.eval)); r < limit/2 {
		limit -= r // the repair to Problem.MaxImbalance follows
	}
	ilpBudget := of(limit, b.JointILP)
	if jm.Chain() {
		ilpBudget = of(limit, b.ChainILP)
	}
	// One node, home flow, per-token patterns: the exact annealing and the
	// bound take over from the ILP (see budget).
	_, exactHome := onenode.Cost(sc)
	var cls []*onenode.Layer // token bitsets per layer, built once for both
	if exactHome && !jm.Chain() && !opts.NoPolish {
		cls, _ = onenode.Layers(sc)
	}
	exactHome = cls != nil
	polishEnd := start.Add(limit)
	if exactHome {
		ilpBudget = of(limit, b.OneNodeILP)
		polishEnd = at(start, limit, b.OneNodePolishEnd)
	}
	if opts.NoPolish {
		ilpBudget = limit
	}
	// Under a work budget W every phase gets the same share of W as of the
	// time: the ILP in nodes, the polish and annealing in moves.
	W := int64(opts.Effort) * 1_000_000
	ilpShare, polishShare := b.JointILP, 1-b.JointILP
	switch {
	case jm.Chain():
		ilpShare, polishShare = b.ChainILP, 1-b.ChainDescentEnd
	case exactHome:
		ilpShare, polishShare = b.OneNodeILP, b.OneNodePolishEnd-b.OneNodeILP
	}
	res := &Result{Baseline: baseSt, BaselineObjective: baseObj}
	solved, err := jm.Solve(ctx, backend, warm, jointilp.SolveOptions{Budget: ilpBudget, Nodes: b.nodes(W, ilpShare), Parallel: opts.Parallel, MinLayer: b.MinLayer, MIP: mipSettings(opts)})
	if err != nil {
		return nil, err
	}
	res.addSizes(solved.Tally)
	assign := solved.Assign
	modelObj := jm.Objective(assign) / 1e6
	report("ilp", modelObj, solved.Bound)
	// Never trust the solver: the model objective is recomputed in Go; the
	// warm start's model objective bounds it from above.
	if warmObj := jm.Objective(warm) / 1e6; modelObj > warmObj*(1+1e-9)+1e-12 {
		return nil, fmt.Errorf("solver: internal error: ILP plan (%.9g s) is worse than its warm start (%.9g s) under the ILP's own model", modelObj, warmObj)
	}
	res.ModelObjective = modelObj
	res.Bound, res.Gap = ilpGap(solved.Bound, modelObj)
	res.Status = mipStatus(solved.Tally)
	switch {
	case solved.TimedOut && W == 0:
		res.Status = StatusTimeLimit
	case solved.TimedOut || res.Status == StatusTimeLimit:
		// Under a work budget a layer kept its warm start because its ILP
		// was too large to solve reproducibly: no proof, no time limit.
		res.Status = StatusFeasible
	}
	if jm.Chain() && !opts.NoPolish {
		if assign, err = chainDescent(ctx, jm, sc, backend, assign, opts, b, start, limit, res); err != nil {
			return nil, err
		}
		report("descent", res.ModelObjective, res.Bound)
	}
	plan := jointilp.AssignPlan(jm.GPUs(), assign, string(StrategyJoint))
	// The ILP's model is a proxy for the exact cost model where tokens
	// share GPUs beyond pairs; a local search on the exact model, started
	// from the ILP plan and from the baseline, keeps the best.
	k := &bestPlan{sc: sc, plan: plan, obj: math.Inf(1)}
	for _, c := range []*placement.Plan{plan, basePlan} {
		cand := c
		if !opts.NoPolish {
			lim := task.Limit{Deadline: polishEnd, Work: work(W, polishShare/2)}
			cand, err = search.Polish(ctx, sc, c, lim, opts.Parallel)
			if err != nil {
				return nil, err
			}
		}
		if err := k.keep(cand); err != nil {
			return nil, err
		}
	}
	report("polish", k.obj, math.NaN())
	if exactHome {
		if res.corners, err = oneNodeFinish(ctx, p, backend, opts, b, start, limit, cls, k, report); err != nil {
			return nil, err
		}
	}
	if best := k.plan; best != plan {
		// The returned plan differs from the ILP's; report the ILP model
		// objective of the returned plan, and the bound stays valid.
		res.ModelObjective = jm.Objective(jointilp.PlanAssign(best)) / 1e6
		if res.ModelObjective > 0 {
			res.Gap = math.Max(0, (res.ModelObjective-res.Bound)/res.ModelObjective)
		}
	}
	res.Plan = k.plan
	return res, nil
}

// solvePaper runs the moetuner strategy (the paper's two ILPs).
func solvePaper(ctx context.Context, p Problem, backend mip.Backend, opts Options, b budget) (*Result, error) {
	W := int64(opts.Effort) * 1_000_000
	pr, err := paper.Solve(ctx, p.Scenario(), backend, paper.Options{
		Stage1Nodes:   b.nodes(W, b.PaperStage1/float64(p.Stats.Layers)),
		Stage2Nodes:   b.nodes(W, 1-b.PaperStage1),
		TimeLimit:     opts.TimeLimit,
		Stage1:        of(opts.TimeLimit, b.PaperStage1),
		MinLayerLimit: b.MinLayer,
		Parallel:      opts.Parallel,
		MIP:           mipSettings(opts),
		EqualSizes:    opts.MoETunerEqualSizes,
	})
	if err != nil {
		if errors.Is(err, paper.ErrNoSolution) {
			return nil, noSolution{err}
		}
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return nil, fmt.Errorf("solver: the moetuner strategy was stopped before its two ILPs had a plan (%w); give it a later deadline, or use the joint strategy, which returns its best plan whenever it is stopped", err)
		}
		return nil, err
	}
	res := &Result{Plan: pr.Plan, Stage1Objective: pr.Stage1, Stage2Objective: pr.Stage2, Status: mipStatus(pr.Tally)}
	res.addSizes(pr.Tally)
	res.Bound, res.Gap, res.ModelObjective = math.NaN(), math.NaN(), math.NaN()
	return res, nil
}

// noSolution keeps an internal no-solution error's message and makes it
// errors.Is ErrNoSolution.
type noSolution struct{ err error }

func (e noSolution) Error() string   { return e.err.Error() }
func (e noSolution) Unwrap() []error { return []error{e.err, ErrNoSolution} }

// bestPlan is the best plan scored so far on the exact cost model.
type bestPlan struct {
	sc   costmodel.Scenario
	plan *placement.Plan
	obj  float64
}

// keep scores cand on the exact cost model and keeps the better plan.
func (k *bestPlan) keep(cand *placement.Plan) error {
	rep, err := k.sc.Evaluate(cand)
	if err != nil {
		return err
	}
	if rep.TimeSec < k.obj-1e-15 {
		k.plan, k.obj = cand, rep.TimeSec
	}
	return nil
}

// oneNodeFinish is the joint path's end on one node, home flow, per-token
// patterns (cls the layers' token bitsets): an exact annealing from k's
// plan within its share, the certified corners of the one-node bound,
// and, when the bound converged early, another annealing; k keeps the
// best plan. It returns the corners.
func oneNodeFinish(ctx context.Context, p Problem, backend mip.Backend, opts Options, b budget, start time.Time, limit time.Duration, cls []*onenode.Layer, k *bestPlan, report func(string, float64, float64)) ([][]onenode.Corner, error) {
	sc := p.Scenario()
	W := int64(opts.Effort) * 1_000_000
	moves := b.AnnealMovesPerExpert * p.Stats.Experts
	annealLim := task.Limit{Deadline: at(start, limit, b.OneNodeAnnealEnd), Work: work(W, b.OneNodeAnnealEnd-b.OneNodePolishEnd)}
	annealed, _ := search.HomeAnneal(ctx, sc, cls, k.plan, moves, b.AnnealRestarts, opts.Parallel, annealLim, b.MinLayer, uint64(opts.Seed))
	if err := k.keep(annealed); err != nil {
		return nil, err
	}
	report("anneal", k.obj, math.NaN())
	boundEnd := start.Add(limit)
	if W > 0 {
		// The bound does not change the plan: it keeps to the clock,
		// in proportion to what the work before it took.
		boundEnd = time.Now().Add(time.Duration(b.BoundTimeFactor * float64(time.Since(start))))
	}
	corners, err := onenode.Bottleneck(ctx, sc, cls, backend, k.plan, boundEnd, opts.Parallel, uint64(opts.Seed), b.Bound)
	if err != nil {
		return nil, err
	}
	if opts.Progress != nil {
		if lb, ok := onenode.LowerBound(sc, corners); ok && lb > 0 {
			report("bound", k.obj, lb)
		}
	}
	// Layers whose bound converged early leave time: anneal again
	// from the best plan (not under a work budget, where what is left
	// depends on the machine).
	if left := time.Until(start.Add(limit)); W == 0 && left > of(limit, b.ReAnnealLeft) && ctx.Err() == nil {
		again, _ := search.HomeAnneal(ctx, sc, cls, k.plan, moves, 1, opts.Parallel, task.Limit{Deadline: start.Add(limit)}, b.MinLayer, uint64(opts.Seed)+1)
		if err := k.keep(again); err != nil {
			return nil, err
		}
		report("anneal", k.obj, math.NaN())
	}
	return corners, nil
}

// chainDescent improves the chain flow's ILP assignment layer by layer
// (jointilp's descent) within its share, and updates res's model
// objective and gap to the assignment it returns.
func chainDescent(ctx context.Context, jm *jointilp.Model, sc costmodel.Scenario, backend mip.Backend, assign [][]int, opts Options, b budget, start time.Time, limit time.Duration, res *Result) ([][]int, error) {
	W := int64(opts.Effort) * 1_000_000
	// The monolithic ILP keeps only the heaviest transition pairs; with
	// neighbours fixed every pair is linear, so descend layer by layer.
	better, err := jm.Descent(ctx, sc, backend, assign, jointilp.DescentOptions{
		Deadline:  at(start, limit, b.ChainDescentEnd),
		StepLimit: max(limit/time.Duration(b.DescentSteps*jm.Layers()), b.DescentStepMin),
		MinLeft:   b.DescentMinLeft,
		StepNodes: b.nodes(W, (b.ChainDescentEnd-b.ChainILP)/float64(b.DescentRounds*jm.Layers())),
		MaxRounds: b.DescentRounds,
		MIP:       mipSettings(opts),
	})
	if err != nil {
		return nil, err
	}
	if mo := jm.Objective(better) / 1e6; mo != res.ModelObjective {
		res.ModelObjective = mo
		if mo > 0 {
			res.Gap = math.Max(0, (mo-res.Bound)/mo)
		}
	}
	return better, nil
}

// ilpGap is the ILP's bound (at most the model objective obj) and its gap
// to obj; both NaN when the solve stopped before HiGHS had a root bound
// (an infinite gap would read as a number everywhere it is shown).
func ilpGap(bound, obj float64) (float64, float64) {
	bound = math.Min(bound, obj)
	switch {
	case math.IsInf(bound, 0) || math.IsNaN(bound):
		return math.NaN(), math.NaN()
	case obj > 0:
		return bound, (obj - bound) / obj
	}
	return bound, 0
}
