package rebalance

import (
	"slices"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// How a proposal's steps are priced: every layer's compute tail in every
// step of the window, with the GPUs' routed tokens as Config.Dispatch
// deals them, and, under SGLang's tables, which deal the whole plan, the
// decision settled on the plan that results.

// windowCost returns per layer the weighted mean over the window's steps
// of the layer's modeled compute tail under plan, with every GPU's routed
// tokens as Config.Dispatch deals them (costmodel.StepScorer: the even
// split of costmodel.StepCompute under even dispatch). Under SGLang's
// table a layer's cost depends on the whole plan.
func (r *Rebalancer) windowCost(s snapshot, plan *placement.Plan) ([]float64, error) {
	sc, err := costmodel.NewStepScorer(plan, r.cfg.Model.TopK, r.cfg.Cluster, r.cfg.Model, costmodel.Options{Dispatch: r.cfg.Dispatch})
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(plan.Layers))
	for i, st := range s.steps {
		tails, err := sc.Tails(st)
		if err != nil {
			return nil, err
		}
		for l, tail := range tails {
			out[l] += s.weights[i] * tail
		}
	}
	for l := range out {
		out[l] /= s.weight
	}
	return out, nil
}

// decideLayers puts back to the running plan every layer of next that
// does not gain by its window cost (curCost against newCost, both by
// windowCost), does not pay for its migration mig within Budget.Horizon
// or changes more than MaxMoves slots, updating next, mig and prop.Kept,
// and returns next's per-layer costs.
func (r *Rebalancer) decideLayers(s snapshot, b Budget, next *placement.Plan, mig, curCost, newCost []float64, prop *Proposal) ([]float64, error) {
	for l := range next.Layers {
		if placement.ChangedSlots(s.current.Layers[l], next.Layers[l]) == 0 {
			next.Layers[l], mig[l] = cloneLayer(s.current.Layers[l]), 0
		}
	}
	// putBack reverts every changed layer that does not gain by newCost,
	// does not pay within the Horizon or exceeds MaxMoves, and reports
	// whether it reverted any.
	putBack := func() bool {
		put := false
		for l := range next.Layers {
			moved := placement.ChangedSlots(s.current.Layers[l], next.Layers[l])
			if moved == 0 {
				continue
			}
			if newCost[l] >= curCost[l]*(1-1e-12) ||
				(b.Horizon > 0 && (curCost[l]-newCost[l])*float64(b.Horizon) <= mig[l]) ||
				(!b.Fresh && b.MaxMoves > 0 && moved > b.MaxMoves) {
				prop.Kept++
				next.Layers[l] = cloneLayer(s.current.Layers[l])
				mig[l] = 0
				put = true
			}
		}
		return put
	}
	if !r.cfg.Dispatch.Dealt() {
		// The layers are independent: a layer put back costs what it
		// costs in the current plan.
		putBack()
		for l := range next.Layers {
			if placement.ChangedSlots(s.current.Layers[l], next.Layers[l]) == 0 {
				newCost[l] = curCost[l]
			}
		}
		return newCost, nil
	}
	return r.settleDealt(s, b, next, mig, curCost, newCost, putBack, prop)
}

// dealtRounds bounds how often Propose re-scores a plan under SGLang's
// table after putting layers back (each round puts back at least one).
const dealtRounds = 4

// settleDealt decides which layers of next to keep under SGLang's table
// (Config.Dispatch.Dealt), where the deal runs through the whole plan from
// one random stream: putting a layer back (another copy count, other
// candidates) changes the deal of every layer after it. It puts back the
// layers that do not gain by newCost, re-scores the plan that results and
// puts back again, for at most dealtRounds rounds, and keeps the current
// plan when the result as a whole is not faster (or, with a Horizon, does
// not pay for its migration). It updates next, mig and prop.Kept and
// returns the result's own per-layer costs, every layer's as dealt in it.
func (r *Rebalancer) settleDealt(s snapshot, b Budget, next *placement.Plan, mig, curCost, newCost []float64, putBack func() bool, prop *Proposal) ([]float64, error) {
	for range dealtRounds {
		if !putBack() {
			break
		}
		fresh, err := r.windowCost(s, next)
		if err != nil {
			return nil, err
		}
		copy(newCost, fresh)
	}
	var cur, cost, move float64
	for l := range next.Layers {
		cur += curCost[l]
		cost += newCost[l]
		move += mig[l]
	}
	if cost < cur*(1-1e-12) && !(b.Horizon > 0 && (cur-cost)*float64(b.Horizon) <= move) {
		return newCost, nil
	}
	for l := range next.Layers {
		if placement.ChangedSlots(s.current.Layers[l], next.Layers[l]) > 0 {
			prop.Kept++
			next.Layers[l] = cloneLayer(s.current.Layers[l])
		}
	}
	clear(mig)
	return slices.Clone(curCost), nil
}
