package solver

import (
	"context"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// polish improves a single-copy plan by pairwise swaps of experts between
// GPUs, scored with the exact cost model (costmodel.Evaluator), until no
// swap helps or the deadline passes. Swaps keep every GPU's slot count.
// In the chain flow a change to layer l also changes layer l+1's time.
func polish(ctx context.Context, p Problem, plan *placement.Plan, deadline time.Time) (*placement.Plan, error) {
	ev, err := costmodel.NewEvaluator(p.Stats, p.Cluster, p.Model, p.evalOpts())
	if err != nil {
		return nil, err
	}
	assign := planAssign(plan)
	L := len(assign)
	lps := make([]placement.LayerPlan, L)
	for l := range L {
		lps[l] = identityLayer(assign[l])
	}
	chain := p.Flow == costmodel.FlowChain
	cost := func(l int) float64 {
		var prev *placement.LayerPlan
		if chain && l > 0 {
			prev = &lps[l-1]
		}
		t := ev.LayerTime(l, lps[l], prev)
		if chain && l+1 < L {
			t += ev.LayerTime(l+1, lps[l+1], &lps[l])
		}
		return t
	}
	for improved := true; improved; {
		improved = false
		for l := range L {
			cur := cost(l)
			gpu := lps[l].SlotGPU
			E := len(gpu)
			for a := 0; a < E; a++ {
				if ctx.Err() != nil || time.Now().After(deadline) {
					return finish(plan.GPUs, lps), nil
				}
				for b := a + 1; b < E; b++ {
					if gpu[a] == gpu[b] {
						continue
					}
					gpu[a], gpu[b] = gpu[b], gpu[a]
					if c := cost(l); c < cur*(1-1e-12) {
						cur = c
						improved = true
					} else {
						gpu[a], gpu[b] = gpu[b], gpu[a]
					}
				}
			}
		}
	}
	return finish(plan.GPUs, lps), nil
}

func identityLayer(assign []int) placement.LayerPlan {
	lp := placement.LayerPlan{SlotExpert: make([]routing.Expert, len(assign)), SlotGPU: make([]placement.GPU, len(assign))}
	for e, g := range assign {
		lp.SlotExpert[e] = routing.Expert(e)
		lp.SlotGPU[e] = placement.GPU(g)
	}
	return lp
}

func finish(gpus int, lps []placement.LayerPlan) *placement.Plan {
	assign := make([][]int, len(lps))
	for l, lp := range lps {
		assign[l] = make([]int, len(lp.SlotGPU))
		for s, g := range lp.SlotGPU {
			assign[l][lp.SlotExpert[s]] = int(g)
		}
	}
	return assignPlan(gpus, assign)
}
