package solver

import (
	"context"
	"time"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/capfix"
	"github.com/moetuner/moetuner/solver/internal/onenode"
)

// ResultCorners returns joint's certified per-layer corners as (L, D)
// pairs: every plan of layer l has busiest routed tokens ≥ L and busiest
// distinct tokens ≥ D for one of them.
func ResultCorners(r *Result) [][][2]float64 {
	out := make([][][2]float64, len(r.corners))
	for l, cs := range r.corners {
		for _, x := range cs {
			out[l] = append(out[l], [2]float64{x.L, x.D})
		}
	}
	return out
}

// CountingBound is the one-node counting bound on the exact cost model,
// without certified corners.
func CountingBound(p Problem) (float64, bool) { return onenode.LowerBound(p.Scenario(), nil) }

// CapImbalance runs the MaxImbalance repair on plan, in place, without a
// deadline, and returns how many layers it changed.
func CapImbalance(p Problem, opts Options, plan *placement.Plan) (int, error) {
	p, err := p.withDefaults()
	if err != nil {
		return 0, err
	}
	n, err := capPlan(context.Background(), p, opts, plan, nil, nil, time.Now().Add(time.Hour))
	return n, public(err)
}

// EnforceImbalance is the cap step of a solve (enforceImbalance) on plan,
// in place: the repair, then the plan scored again and repaired again
// until every layer holds the cap.
func EnforceImbalance(p Problem, opts Options, plan *placement.Plan) error {
	p, err := p.withDefaults()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	return public(enforceImbalance(ctx, p, opts, &Result{Plan: plan}))
}

// RepairImbalance is CapImbalance without the balance-first baseline to
// fall back on: only the repair's own moves change the plan.
func RepairImbalance(p Problem, opts Options, plan *placement.Plan) (int, error) {
	p, err := p.withDefaults()
	if err != nil {
		return 0, err
	}
	n, err := capfix.Cap(context.Background(), capProblem(p, opts), plan, nil, nil, nil, time.Now().Add(time.Hour))
	return n, public(err)
}

// WithoutDefaultBackend returns o solving as a build without cgo does
// when o.Backend is nil: with no ILP backend at all.
func WithoutDefaultBackend(o Options) Options {
	o.noDefaultBackend = true
	return o
}

// JointModelObjective is jointModelObjective, for the tests outside the
// package.
func JointModelObjective(p Problem, plan *placement.Plan, opts Options) (float64, error) {
	return jointModelObjective(p, plan, opts)
}
