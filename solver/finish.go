package solver

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/placement"
)

// runStrategy runs opts.Strategy on p (defaults applied, checked) within
// the budget b from start: a baseline, the paper's ILPs, or joint, which
// plans with planningStats(p) and leaves the scoring to the facade.
func runStrategy(ctx context.Context, p Problem, opts Options, b budget, start time.Time) (res *Result, err error) {
	st := opts.Strategy
	switch st {
	case StrategyContiguous, StrategyRoundRobin, StrategyGreedy, StrategyEPLB, StrategyEPLBHierarchical:
		var plan *placement.Plan
		plan, err = Baseline(p, st)
		if err == nil {
			res = &Result{Plan: plan, Status: StatusHeuristic}
		}
	case StrategyMoETuner:
		if opts.Backend == nil {
			return nil, &BackendError{Strategy: st, Needs: "the paper's two ILPs"}
		}
		res, err = solvePaper(ctx, p, opts.Backend, opts, b)
		if err == nil && opts.MoETunerEqualSizes {
			res.Note = "E/G experts per cluster"
		}
	case StrategyJoint:
		q := p
		q.Stats = planningStats(p)
		if p.Current != nil && !movesBudgeted(p, opts) && currentFits(p) {
			// Free moves: the running plan bounds nothing, so the
			// layers are planned afresh (a local search from it ends
			// where its moves stop), and it is kept only if faster.
			res, err = solveFresh(ctx, q, opts, b, start)
		} else {
			res, err = solveJointPath(ctx, q, opts, b, start)
		}
		if res != nil && q.Stats != p.Stats {
			res.report = nil // scored on the statistics as recorded below
		}
	default:
		return nil, fmt.Errorf("solver: unknown strategy %q", st)
	}
	return res, err
}

// finish enforces the cap, applies an optimal split, validates the plan
// and scores it on p.Stats as recorded (the cost bound and the fields a
// strategy leaves unset included): what Solve returns for every strategy.
func finish(ctx context.Context, p Problem, opts Options, res *Result) error {
	st := res.Strategy
	var err error
	if p.MaxImbalance > 0 && st == StrategyJoint {
		before := res.report
		if err := enforceImbalance(ctx, p, opts, res); err != nil {
			return public(err)
		}
		if res.report != before && res.Balance == nil && !math.IsNaN(res.ModelObjective) {
			// The repair moved experts of the ILP's plan: its model
			// objective and gap are the repaired plan's (the dual bound
			// holds for every plan).
			q := p
			q.Stats = planningStats(p)
			if mo, err := jointModelObjective(q, res.Plan, opts); err == nil {
				res.ModelObjective = mo
				res.Gap = math.NaN()
				if mo > 0 {
					res.Gap = math.Max(0, (mo-res.Bound)/mo)
				}
			}
		}
	}
	if p.Split == SplitOptimal {
		applyOptimalSplit(p, res)
	}
	res.Plan.Strategy = string(st)
	if err := res.Plan.Validate(placement.ValidateOptions{Experts: p.Stats.Experts, Layers: p.Stats.Layers}); err != nil {
		return fmt.Errorf("solver: %s produced an invalid plan: %w", st, err)
	}
	rep := res.report
	if rep == nil || p.Split == SplitOptimal {
		if rep, err = p.Scenario().Evaluate(res.Plan); err != nil {
			return err
		}
	}
	res.Report, res.Objective = rep, rep.TimeSec
	res.CostBound, res.CostGap = math.NaN(), math.NaN()
	if lb, ok := costLowerBound(p, res.corners); ok && lb > 0 {
		res.CostBound, res.CostGap = lb, res.Objective/lb-1
	}
	if st != StrategyJoint {
		res.ModelObjective, res.Bound, res.Gap = nan(res.ModelObjective), nan(res.Bound), nan(res.Gap)
	}
	if st != StrategyMoETuner {
		res.Stage1Objective, res.Stage2Objective = math.NaN(), math.NaN()
	}
	return nil
}
