package baseline

import (
	"fmt"
	"maps"
	"math"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// AddCopiesOptions are the optional settings of AddCopies; the zero value
// gives every GPU the same speed.
type AddCopiesOptions struct {
	// Speed is the relative compute speed of every GPU (len GPUs, each > 0);
	// a GPU's load is its token count divided by its speed. Nil means all 1.
	Speed []float64
}

// AddCopies fills every GPU of plan up to slotsPerGPU[g] slots per layer
// with extra copies of the hottest experts, so that a strategy that places
// one copy per expert (contiguous, round-robin, greedy, moetuner) gives a
// plan of the physical slot count the stack was started with (SGLang's
// and vLLM's P = E + redundant experts). The existing copies stay where
// they are. Each new copy goes, one at a time, to the expert whose copies
// carry the most tokens each (stats.Load split evenly over its copies;
// ties: lower expert id), placed on the least loaded GPU (tokens over
// speed; ties: lower GPU index) that has a free slot and no copy of that
// expert yet. The result is a new plan, GPU-major; plan is not changed.
// AddCopies fails when a GPU already holds more than slotsPerGPU[g] slots,
// when the stats do not match the plan, or when the free slots cannot take
// a copy without two copies of one expert on one GPU.
func AddCopies(plan *placement.Plan, stats *routing.Stats, slotsPerGPU []int, opts AddCopiesOptions) (*placement.Plan, error) {
	switch {
	case plan == nil || stats == nil:
		return nil, fmt.Errorf("baseline: add copies: nil plan or stats")
	case len(slotsPerGPU) != plan.GPUs:
		return nil, fmt.Errorf("baseline: add copies: %d slot counts for %d GPUs", len(slotsPerGPU), plan.GPUs)
	case len(plan.Layers) != stats.Layers || plan.Experts != stats.Experts || len(stats.Load) != stats.Layers:
		return nil, fmt.Errorf("baseline: add copies: plan of %d layers × %d experts, stats of %d × %d", len(plan.Layers), plan.Experts, stats.Layers, stats.Experts)
	case opts.Speed != nil && len(opts.Speed) != plan.GPUs:
		return nil, fmt.Errorf("baseline: add copies: AddCopiesOptions.Speed has %d entries for %d GPUs", len(opts.Speed), plan.GPUs)
	}
	speed := func(g int) float64 {
		if opts.Speed != nil && opts.Speed[g] > 0 && !math.IsInf(opts.Speed[g], 0) {
			return opts.Speed[g]
		}
		return 1
	}
	G, E := plan.GPUs, plan.Experts
	copies := make([][][]placement.GPU, len(plan.Layers))
	for l := range plan.Layers {
		if len(stats.Load[l]) != E {
			return nil, fmt.Errorf("baseline: add copies: stats.Load[%d] has %d experts, the plan %d", l, len(stats.Load[l]), E)
		}
		w := stats.Load[l]
		row := plan.ExpertGPUs(l)
		used := plan.SlotsPerGPU(l)
		free := 0
		for g := range G {
			if used[g] > slotsPerGPU[g] {
				return nil, fmt.Errorf("baseline: add copies: layer %d: GPU %d holds %d slots, more than the %d it is given", l, g, used[g], slotsPerGPU[g])
			}
			free += slotsPerGPU[g] - used[g]
		}
		// holds[e*G+g]: expert e already has a copy on GPU g.
		holds := make([]bool, E*G)
		for e, gs := range row {
			for _, g := range gs {
				holds[e*G+int(g)] = true
			}
		}
		for ; free > 0; free-- {
			load := make([]float64, G)
			for e, gs := range row {
				for _, g := range gs {
					load[g] += w[e] / float64(len(gs))
				}
			}
			bestE, bestG := -1, -1
			bestShare := math.Inf(-1)
			for e, gs := range row {
				share := math.Inf(1) // an expert without a copy comes first
				if len(gs) > 0 {
					share = w[e] / float64(len(gs))
				}
				if share <= bestShare {
					continue
				}
				g := -1
				for c := range G {
					if used[c] < slotsPerGPU[c] && !holds[e*G+c] && (g < 0 || load[c]/speed(c) < load[g]/speed(g)) {
						g = c
					}
				}
				if g >= 0 {
					bestE, bestG, bestShare = e, g, share
				}
			}
			if bestE < 0 {
				return nil, fmt.Errorf("baseline: add copies: layer %d: %d free slots left, but every GPU with a free slot already holds each expert", l, free)
			}
			row[bestE] = append(row[bestE], placement.GPU(bestG))
			holds[bestE*G+bestG] = true
			used[bestG]++
		}
		copies[l] = row
	}
	out := placement.FromReplicas(G, copies, plan.Strategy)
	out.Meta = maps.Clone(plan.Meta)
	return out, nil
}
