package solver

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// polish improves a plan by swapping the GPUs of two slots (two copies of
// different experts on different GPUs), scored with the exact cost model
// (costmodel.Evaluator), until no swap helps or the deadline passes. Swaps
// keep every GPU's slot count and never put two copies of one expert on
// one GPU; with one copy per expert they are expert swaps.
//
// Layers are polished in parallel on workers goroutines, each with its own
// Evaluator. In the home flow layers are independent; in the chain flow a
// change to layer l also changes layer l+1's time, so even and odd layers
// take turns (a layer's cost reads only its neighbours, which the other
// phase owns).
func polish(ctx context.Context, p Problem, plan *placement.Plan, deadline time.Time, workers int) (*placement.Plan, error) {
	workers = max(workers, 1)
	evs := make([]*costmodel.Evaluator, workers)
	for w := range evs {
		ev, err := costmodel.NewEvaluator(p.Stats, p.Cluster, p.Model, p.evalOpts())
		if err != nil {
			return nil, err
		}
		evs[w] = ev
	}
	work := plan.Clone()
	lps := work.Layers
	L := len(lps)
	chain := p.Flow == costmodel.FlowChain
	cost := func(ev *costmodel.Evaluator, l int) float64 {
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
	stopped := func() bool { return ctx.Err() != nil || time.Now().After(deadline) }
	// polishLayer runs one pass of first-improvement swaps over layer l.
	polishLayer := func(ev *costmodel.Evaluator, l int) bool {
		improved := false
		cur := cost(ev, l)
		gpu, exp := lps[l].SlotGPU, lps[l].SlotExpert
		has := make(map[[2]int]bool, len(gpu))
		for s := range gpu {
			has[[2]int{int(gpu[s]), int(exp[s])}] = true
		}
		for a := range gpu {
			if stopped() {
				return improved
			}
			for b := a + 1; b < len(gpu); b++ {
				ga, gb := gpu[a], gpu[b]
				if ga == gb || exp[a] == exp[b] || has[[2]int{int(gb), int(exp[a])}] || has[[2]int{int(ga), int(exp[b])}] {
					continue
				}
				gpu[a], gpu[b] = gb, ga
				if c := cost(ev, l); c < cur*(1-1e-12) {
					cur, improved = c, true
					delete(has, [2]int{int(ga), int(exp[a])})
					delete(has, [2]int{int(gb), int(exp[b])})
					has[[2]int{int(gb), int(exp[a])}] = true
					has[[2]int{int(ga), int(exp[b])}] = true
				} else {
					gpu[a], gpu[b] = ga, gb
				}
			}
		}
		return improved
	}
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
	for improved := true; improved && !stopped(); {
		var any atomic.Bool
		for _, layers := range phases {
			var wg sync.WaitGroup
			next := atomic.Int64{}
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1)) - 1
						if i >= len(layers) {
							return
						}
						if polishLayer(evs[w], layers[i]) {
							any.Store(true)
						}
					}
				}()
			}
			wg.Wait()
		}
		improved = any.Load()
	}
	return canonicalPlan(work), nil
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
