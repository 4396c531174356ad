// Package affinitypath is the joint strategy's production-scale pipeline
// around the affinity search (solver/internal/affinity): from a balanced
// start plan that the caller chose (the replicated path's packing or the
// best baseline), it bounds the remote-node copies any plan must send
// (trafficbound) within its share of the limit, runs the search of the
// plan's flow, and keeps the search's plan only when the cost model,
// evaluated on the plan itself, agrees that it is better.
package affinitypath

import (
	"context"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/affinity"
	"github.com/moetuner/moetuner/solver/internal/capfix"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// Problem is one pipeline: the search's problem (its Start and
// StartReport the start plan and its report, EvalTime one evaluation's
// time; Current, MaxMoves and MoveCost set only when the running plan
// bounds or prices the moves; MaxImbalance the cap as the search can
// measure it) and what the bound needs beside it.
type Problem struct {
	affinity.Problem
	// Bound says the remote-copy bound applies (a closed-form dispatch,
	// or vLLM's and TensorRT-LLM's expectation, the even split, not vLLM's
	// hash counted token by token; the home flow, or the chain flow with
	// one copy of every expert).
	Bound bool
	// BoundCap is the cap the bound's capped pass assumes (the problem's
	// MaxImbalance, whatever the split; 0: none).
	BoundCap float64
}

// Options bound the pipeline, in the solve's terms.
type Options struct {
	// Start and Limit are the solve's start and time limit; Work its work
	// budget (0: by time).
	Start time.Time
	Limit time.Duration
	Work  int64
	// Reserve is what follows the search within the limit (evaluating its
	// plan, the repair to a cap, an optimal split).
	Reserve time.Duration
	// StartShare is the share of the limit (and of the work) the start
	// plan had; BoundShare the bound's share of the limit, from when it
	// starts.
	StartShare, BoundShare float64
	// BoundCappedPasses: the capped bound pass runs alone when the
	// bound's share holds this many first passes; BoundStepRounds: the
	// pass with the spectral shift steps runs when the share left holds
	// this many rounds of layers.
	BoundCappedPasses, BoundStepRounds float64
	Parallel                           int
	MinLayer                           time.Duration
	// Shares split each layer's share among the search's phases.
	Shares affinity.Shares
}

// Result is the better of the start and the search's plan, with its
// report, and the remote-copy bound when one was computed.
type Result struct {
	Plan   *placement.Plan
	Report *costmodel.Report
	// Bounded says RemoteBound holds: at least RemoteBoundLayers layers'
	// remote-node copies per token and layer (the layers not bounded
	// counting 0), under the cap RemoteBoundCap (0: none).
	Bounded           bool
	RemoteBound       float64
	RemoteBoundLayers int
	RemoteBoundCap    float64
}

// Run bounds the remote copies (when p.Bound), runs the search of p's flow
// from p.Start and returns the better plan.
func Run(ctx context.Context, p Problem, opts Options) (*Result, error) {
	res := &Result{}
	if p.Bound {
		remoteBound(ctx, p, opts, res)
	}
	ao := affinity.Options{
		Limit:    task.Limit{Deadline: opts.Start.Add(opts.Limit - opts.Reserve), Work: work(opts.Work, 1-opts.StartShare)},
		Parallel: opts.Parallel,
		MinLayer: opts.MinLayer,
		Shares:   opts.Shares,
	}
	solve := affinity.Solve
	if p.Flow == costmodel.FlowChain {
		solve = affinity.SolveChain
	}
	ar, err := solve(ctx, p.Problem, ao)
	if err != nil {
		return nil, err
	}
	plan := placement.FromReplicas(p.Cluster.GPUs(), ar.Copies, "joint")
	res.Plan, res.Report = p.Start, p.StartReport
	if !placement.SameCopies(plan, p.Start) {
		// The search moved something: keep it only if the cost model,
		// evaluated on the plan itself, agrees that it is better.
		r, err := p.Evaluate(plan)
		if err != nil {
			return nil, err
		}
		// Under a move cost the plans are compared with their moves
		// charged, as the search priced them.
		// Under a cap the search's plan may be slower where the start
		// breaks the cap: it is then kept when it leaves fewer layers
		// above the cap (the repair that follows must bring them under).
		over, overFirst := capfix.LayersOver(p.Cluster, r, p.MaxImbalance), capfix.LayersOver(p.Cluster, p.StartReport, p.MaxImbalance)
		better := over < overFirst || over == overFirst && r.TimeSec+moveCharge(p, plan) <= p.StartReport.TimeSec+moveCharge(p, p.Start)
		if better && withinMoves(p, plan) {
			res.Plan, res.Report = plan, r
		}
	}
	return res, nil
}

// work returns the share of a work budget of w units (0: none, time mode),
// as the solver's budget counts it.
func work(w int64, share float64) int64 {
	if w <= 0 {
		return 0
	}
	return max(1, int64(share*float64(w)))
}

// of returns share·limit.
func of(limit time.Duration, share float64) time.Duration {
	return time.Duration(share * float64(limit))
}

// withinMoves reports whether plan changes at most p.MaxMoves slots of
// p.Current in every layer (always, without a bound).
func withinMoves(p Problem, plan *placement.Plan) bool {
	if p.Current == nil || p.MaxMoves <= 0 {
		return true
	}
	for l := range plan.Layers {
		if placement.ChangedSlots(p.Current.Layers[l], plan.Layers[l]) > p.MaxMoves {
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
	sec := 0.0
	for l := range plan.Layers {
		sec += affinity.SlotCharge(p.Scenario, p.MoveCost, l) * float64(placement.ChangedSlots(p.Current.Layers[l], plan.Layers[l]))
	}
	return sec
}
