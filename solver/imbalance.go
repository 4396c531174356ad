package solver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/capfix"
	"github.com/moetuner/moetuner/solver/internal/replica"
)

// capProblem is p's cap repair problem (capfix), with opts's move bound.
func capProblem(p Problem, opts Options) capfix.Problem {
	return capfix.Problem{
		Scenario:     p.Scenario(),
		MaxImbalance: p.MaxImbalance,
		ExpertGroups: p.ExpertGroups,
		Current:      p.Current,
		MaxMoves:     opts.MaxMoves,
		Redundant:    p.RedundantSlots != 0 || p.SlotsPerGPU != nil,
	}
}

// refuseBeforeSolve returns a *task.Infeasible (which public makes an
// *InfeasibleError), before any search, when some layer cannot meet
// p.MaxImbalance with p's slots per GPU (capfix.Refuse).
func refuseBeforeSolve(p Problem) error {
	return capfix.Refuse(capProblem(p, Options{}), replicaProblem(p, Options{}))
}

// capPlan is capfix.Cap with the balance-first baseline of p's shape as
// the fallback: hierarchical EPLB under expert groups, EPLB with
// redundant slots, greedy without.
func capPlan(ctx context.Context, p Problem, opts Options, plan *placement.Plan, rep *costmodel.Report, proven []float64, deadline time.Time) (int, error) {
	var fallback *placement.Plan
	var err error
	switch {
	case p.ExpertGroups > 0:
		fallback, err = Baseline(p, StrategyEPLBHierarchical)
	case p.replicated():
		fallback, err = Baseline(p, StrategyEPLB)
	default:
		fallback, err = Baseline(p, StrategyGreedy)
	}
	if err != nil {
		fallback = nil // capfix.Cap then repairs the plan's own layers only
	}
	return capfix.Cap(ctx, capProblem(p, opts), plan, rep, fallback, proven, deadline)
}

// provenFloors is, per layer, res's certified lower bound on busiest/mean
// (Bound over Mean), which holds for every plan with p's slots per GPU
// under p's dispatch; nil where res has none, and under an optimal split
// or workloads, where the cap is not measured the way the bound is.
func provenFloors(p Problem, res *Result) []float64 {
	if res.Balance == nil || len(res.Balance.Layers) != p.Stats.Layers || p.Split == SplitOptimal || len(p.Workloads) > 0 {
		return nil
	}
	out := make([]float64, p.Stats.Layers)
	for l, lb := range res.Balance.Layers {
		if lb.Mean > 0 {
			out[l] = lb.Bound / lb.Mean
		}
	}
	return out
}

// enforceImbalance caps res.Plan's layers at p.MaxImbalance
// (capPlan, until ctx ends) and, where it changed the plan, drops
// what described the old one: the strategy's report, the layers'
// certified balance and the gap are recomputed from the new plan.
func enforceImbalance(ctx context.Context, p Problem, opts Options, res *Result) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(opts.TimeLimit)
	}
	changed, err := capPlan(ctx, p, opts, res.Plan, res.report, provenFloors(p, res), deadline)
	if err != nil || changed == 0 {
		return err
	}
	rep, err := p.Scenario().Evaluate(res.Plan)
	if err != nil {
		return err
	}
	// Under SGLang's tables a repaired layer can move the deal of the
	// layers after it (a copy count changed, or a copy moved into or out
	// of a rank's node in the node trees) and put one of them over the
	// cap: the plan is scored again and repaired again until every layer
	// holds it; at the deadline the repair names what is still over.
	for capfix.LayersOver(p.Cluster, rep, p.MaxImbalance) > 0 {
		n, err := capPlan(ctx, p, opts, res.Plan, rep, nil, deadline)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("solver: the cap repair left %d layers over Problem.MaxImbalance %g and changed nothing", capfix.LayersOver(p.Cluster, rep, p.MaxImbalance), p.MaxImbalance)
		}
		changed += n
		if rep, err = p.Scenario().Evaluate(res.Plan); err != nil {
			return err
		}
	}
	res.report = rep
	if res.Balance != nil {
		// Certified as the path that made the plan certifies it.
		var bal *BalanceReport
		if useAffinity(p, opts, defaultBudget) {
			bal, err = balanceOf(p, rep)
		} else {
			var rb *replica.BalanceReport
			rb, err = replica.Certify(replicaProblem(p, opts), res.Plan)
			if err == nil {
				bal = publicBalance(rb)
			}
		}
		if err != nil {
			return err
		}
		res.Balance, res.Gap = bal, bal.MaxGap
	}
	layers := "layers"
	if changed == 1 {
		layers = "layer"
	}
	res.Note = strings.TrimPrefix(res.Note+fmt.Sprintf("; %d %s repaired to meet Problem.MaxImbalance", changed, layers), "; ")
	return nil
}
