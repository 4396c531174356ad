// Package search improves plans on the exact cost model by local search:
// slot swaps scored by costmodel's incremental Evaluator (Polish) and
// annealing on the exact cost of the one-node home flow (HomeAnneal).
package search

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// Polish improves a plan by swapping the GPUs of two slots (two copies of
// different experts on different GPUs), scored with the exact cost model
// (costmodel.Evaluator), until no swap helps or the deadline passes. Swaps
// keep every GPU's slot count and never put two copies of one expert on
// one GPU; with one copy per expert they are expert swaps.
//
// Layers are polished in parallel on workers goroutines, each with its own
// Evaluator. In the home flow layers are independent; in the chain flow a
// change to layer l also changes layer l+1's time, so even and odd layers
// take turns (a layer's cost reads only its neighbours, which the other
// phase owns), and after every phase each evaluator takes the layers the
// others changed.
//
// The limit is a deadline, or a work budget of scored swaps shared evenly
// by the layers (each layer stops after its share, whichever goroutine runs
// it, so the result does not depend on the machine).
func Polish(ctx context.Context, sc costmodel.Scenario, plan *placement.Plan, lim task.Limit, workers int) (*placement.Plan, error) {
	workers = max(workers, 1)
	evs := make([]*costmodel.Evaluator, workers)
	for w := range evs {
		ev, err := sc.NewEvaluator(plan)
		if err != nil {
			return nil, err
		}
		evs[w] = ev
	}
	L := len(plan.Layers)
	chain := sc.Flow == costmodel.FlowChain
	meters := make([]*task.Meter, L)
	for l := range meters {
		meters[l] = lim.Share(L).Meter(ctx)
	}
	global := lim.Meter(ctx)
	stopped := func() bool { return !lim.ByWork() && global.Done() }
	pass := func(ev *costmodel.Evaluator, l int) (bool, error) { return polishLayer(ev, l, chain, meters[l]) }
	phases := [][]int{nil}
	for l := range L {
		phases[0] = append(phases[0], l)
	}
	if chain {
		phases = [][]int{nil, nil}
		for l := range L {
			phases[l%2] = append(phases[l%2], l)
		}
	}
	owner := make([]int, L) // the evaluator holding layer l's latest slots
	var firstErr error
	var errMu sync.Mutex
	for improved := true; improved && !stopped() && ctx.Err() == nil; {
		var any atomic.Bool
		for _, layers := range phases {
			var wg sync.WaitGroup
			next := atomic.Int64{}
			changed := make([]bool, L)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1)) - 1
						if i >= len(layers) {
							return
						}
						l := layers[i]
						ok, err := pass(evs[w], l)
						if err != nil {
							errMu.Lock()
							firstErr = err
							errMu.Unlock()
							return
						}
						owner[l] = w
						if ok {
							changed[l] = true
							any.Store(true)
						}
					}
				}()
			}
			wg.Wait()
			if firstErr != nil {
				return nil, firstErr
			}
			// Every evaluator takes the layers the others changed.
			for l, c := range changed {
				if !c {
					continue
				}
				for w, ev := range evs {
					if w != owner[l] {
						if err := ev.SetLayer(l, evs[owner[l]].Layer(l)); err != nil {
							return nil, err
						}
					}
				}
			}
		}
		improved = any.Load()
	}
	return canonicalPlan(evs[0].Plan()), nil
}

// polishLayer runs one pass of first-improvement swaps over layer l of
// ev within meter, and reports whether a swap improved it. In the chain
// flow a layer's cost includes the next layer's time.
func polishLayer(ev *costmodel.Evaluator, l int, chain bool, meter *task.Meter) (bool, error) {
	cost := func(ev *costmodel.Evaluator, l int) float64 {
		t := ev.LayerCost(l)
		if chain && l+1 < ev.Layers() {
			t += ev.LayerCost(l + 1)
		}
		return t
	}
	improved := false
	cur := cost(ev, l)
	lp := ev.Layer(l)
	gpu, exp := lp.SlotGPU, lp.SlotExpert
	has := make(map[[2]int]bool, len(gpu))
	for s := range gpu {
		has[[2]int{int(gpu[s]), int(exp[s])}] = true
	}
	for a := range gpu {
		if meter.Done() {
			return improved, nil
		}
		for b := a + 1; b < len(gpu); b++ {
			ga, gb := gpu[a], gpu[b]
			if ga == gb || exp[a] == exp[b] || has[[2]int{int(gb), int(exp[a])}] || has[[2]int{int(ga), int(exp[b])}] {
				continue
			}
			if meter.Work() && meter.Done() {
				return improved, nil
			}
			meter.Spend(1)
			m := costmodel.Move{Kind: costmodel.MoveSwap, Layer: l, Slot: a, Other: b}
			d, err := ev.Delta(m)
			if err != nil {
				return improved, err
			}
			if d < -cur*1e-12 {
				if err := ev.Apply(m); err != nil {
					return improved, err
				}
				cur, improved = cost(ev, l), true
				delete(has, [2]int{int(ga), int(exp[a])})
				delete(has, [2]int{int(gb), int(exp[b])})
				has[[2]int{int(gb), int(exp[a])}] = true
				has[[2]int{int(ga), int(exp[b])}] = true
			}
		}
	}
	return improved, nil
}

// canonicalPlan lays out slots GPU-major with ascending experts, the form
// FromAssignment and FromReplicas produce (and SGLang's files need).
func canonicalPlan(p *placement.Plan) *placement.Plan {
	copies := make([][][]placement.GPU, len(p.Layers))
	for l := range p.Layers {
		copies[l] = p.ExpertGPUs(l)
	}
	out := placement.FromReplicas(p.GPUs, copies, p.Strategy)
	out.Experts = p.Experts
	return out
}
