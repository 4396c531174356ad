package solver

import (
	"context"
	"math"
	"time"

	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/solver/internal/replica"
)

// solveReplicated runs the joint strategy with replicas (see the package
// doc), with b's time splits.
func solveReplicated(ctx context.Context, p Problem, backend mip.Backend, opts Options, b budget, start time.Time) (*Result, error) {
	ro := b.Replica
	ro.Start = start
	ro.Deadline = start.Add(opts.TimeLimit)
	ro.LayerShare = b.ReplicaLayers
	ro.Parallel = opts.Parallel
	ro.MinLayer = b.MinLayer
	ro.NoPolish = opts.NoPolish
	if p.Split == SplitOptimal {
		// The optimal splits' flows for every layer cost about one
		// evaluation (0.3 s against 0.36 s on 32k tokens, 4 × 8 GPUs,
		// 32 redundant slots), and the plan is scored again after them.
		ro.AfterEvals = 2
	}
	ro.AfterEvals += imbalanceEvals(p)
	if opts.Effort > 0 {
		ro.Work = int64(opts.Effort) * 1_000_000
		ro.PairProbeNodes = b.nodes(ro.Work, b.ReplicaPairProbe)
	}
	rr, err := replica.Solve(ctx, replicaProblem(p, opts), backend, ro)
	if err != nil {
		return nil, err
	}
	if opts.Progress != nil {
		// Without the solve's own report the progress costs one
		// evaluation, made only when someone listens.
		rep := rr.Report
		if rep == nil {
			rep, _ = p.Scenario().Evaluate(rr.Plan)
		}
		if rep != nil {
			reporter(opts, start)("replicas", rep.TimeSec, math.NaN())
		}
	}
	res := &Result{Plan: rr.Plan, Status: StatusFeasible, Balance: publicBalance(rr.Balance), report: rr.Report}
	if rr.Optimal {
		res.Status = StatusOptimal
	}
	if rr.TimedOut {
		res.Status = StatusTimeLimit
	}
	// For replicated plans the certified quantity is the busiest-GPU load:
	// Gap is the largest per-layer gap to its bound.
	res.Gap = res.Balance.MaxGap
	res.Bound, res.ModelObjective = math.NaN(), math.NaN()
	return res, nil
}

// replicaProblem is p for the replicated path.
func replicaProblem(p Problem, opts Options) replica.Problem {
	return replica.Problem{
		Scenario:       p.Scenario(),
		RedundantSlots: p.RedundantSlots,
		SlotsPerGPU:    p.SlotsPerGPU,
		ExpertGroups:   p.ExpertGroups,
		Workloads:      p.Workloads,
		Across:         replica.Across(p.Across),
		Current:        p.Current,
		MaxMoves:       opts.MaxMoves,
		MoveCost:       p.MoveCost,
	}
}

// slotCounts is every GPU's slot count per layer: SlotsPerGPU, or the
// experts plus the redundant slots spread evenly (the caller has checked
// that they divide).
func (p Problem) slotCounts() []int {
	if p.SlotsPerGPU != nil {
		return append([]int(nil), p.SlotsPerGPU...)
	}
	G := p.Cluster.GPUs()
	out := make([]int, G)
	for g := range out {
		out[g] = (p.Stats.Experts + p.RedundantSlots) / G
	}
	return out
}
