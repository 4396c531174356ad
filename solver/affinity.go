package solver

import (
	"context"
	"math"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/affinity"
	"github.com/moetuner/moetuner/solver/internal/replica"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// useAffinity reports whether the joint strategy runs the production-scale
// affinity search (see the package doc): the home flow on several nodes
// with per-token paths, even or per-source dispatch without a per-slot
// split, one workload, no running plan and no expert groups; and either
// replicas, or a single-copy layer too large for the joint ILP (more than
// EffortMaxCols assignment columns, E·G, per layer).
func useAffinity(p Problem, b budget) bool {
	s := p.Stats
	if p.Flow != costmodel.FlowHome || p.Cluster.Nodes < 2 || s.Patterns == nil || p.Split == SplitOptimal ||
		len(p.Workloads) > 0 || p.Current != nil || p.ExpertGroups > 0 {
		return false
	}
	return p.replicated() || s.Experts*p.Cluster.GPUs() > b.EffortMaxCols
}

// solveAffinity starts from a balanced plan (the replicated path's packing,
// or the best baseline without replicas) and improves it with the affinity
// search; the better of the two by the cost model is returned.
func solveAffinity(ctx context.Context, p Problem, backend mip.Backend, opts Options, b budget, start time.Time) (*Result, error) {
	sc := p.Scenario()
	W := int64(opts.Effort) * 1_000_000
	limit := opts.TimeLimit
	res := &Result{Status: StatusFeasible}
	var first *placement.Plan
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
		st, plan, obj, err := bestBaseline(p)
		if err != nil {
			return nil, err
		}
		first = plan
		res.Baseline, res.BaselineObjective = st, obj
	}
	firstRep, err := sc.Evaluate(first)
	if err != nil {
		return nil, err
	}
	if p.replicated() {
		res.BaselineObjective = firstRep.TimeSec
	}
	slots := p.slotCounts()
	ao := affinity.Options{
		Limit:    task.Limit{Deadline: start.Add(limit), Work: work(W, 1-b.AffinityStart)},
		Parallel: opts.Parallel,
		MinLayer: b.MinLayer,
		Shares:   b.Affinity,
	}
	ar, err := affinity.Solve(ctx, affinity.Problem{Scenario: sc, Slots: slots, Start: first}, ao)
	if err != nil {
		return nil, err
	}
	plan := placement.FromReplicas(p.Cluster.GPUs(), ar.Copies, "joint")
	rep, err := sc.Evaluate(plan)
	if err != nil {
		return nil, err
	}
	res.Plan = plan
	if rep.TimeSec > firstRep.TimeSec {
		res.Plan = first
	}
	if W == 0 && time.Now().After(start.Add(limit)) {
		res.Status = StatusTimeLimit
	}
	res.Bound, res.ModelObjective = math.NaN(), math.NaN()
	if p.replicated() {
		bal, err := balanceOf(p, res.Plan)
		if err != nil {
			return nil, err
		}
		res.Balance = bal
		res.Gap = bal.MaxGap
	}
	res.Note = "affinity search"
	return res, nil
}

// balanceOf certifies a replicated plan's busiest GPU per layer (its
// tokens over its speed, under the problem's dispatch) against the bound
// max(mean, largest replica).
func balanceOf(p Problem, plan *placement.Plan) (*BalanceReport, error) {
	mean, bound, err := replica.Bounds(replicaProblem(p, Options{}))
	if err != nil {
		return nil, err
	}
	rep, err := p.Scenario().Evaluate(plan)
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
