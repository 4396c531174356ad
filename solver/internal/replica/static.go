package replica

import (
	"math"
	"slices"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// Under static dispatch a source with a copy of an expert on its own GPU
// sends that copy all its tokens for the expert, and every other source
// splits evenly over the copies (placement.StaticSplit). With the share
// src[h·E+e] of expert e's tokens sourced on GPU h, copy g of an expert
// with copies C (n of them) serves load·(src[g·E+e] + (1 − Σ_{h∈C}
// src[h·E+e])/n): its own source's tokens and an even part of the rest.
// The packer balances the even split; these loads are what the cost model
// counts, and where some sources send an expert much more than others a
// copy on such a source's GPU carries more than its even part.

// staticShare is copy g's share of expert e's tokens when e's copies sit
// on gs, under static dispatch with source shares src (E experts).
func staticShare(gs []placement.GPU, g placement.GPU, e, E int, src []float64) float64 {
	if len(gs) == 1 {
		return 1
	}
	owned := 0.0
	for _, h := range gs {
		owned += src[int(h)*E+e]
	}
	return src[int(g)*E+e] + (1-owned)/float64(len(gs))
}

// staticLoads is gpuLoads under static dispatch: one layer's token load
// per GPU divided by its speed.
func staticLoads(load []float64, copies [][]placement.GPU, speed []float64, src []float64) []float64 {
	E := len(load)
	gl := make([]float64, len(speed))
	for e, gs := range copies {
		if load[e] == 0 {
			continue
		}
		for _, g := range gs {
			gl[g] += load[e] * staticShare(gs, g, e, E, src)
		}
	}
	for g := range gl {
		gl[g] /= speed[g]
	}
	return gl
}

// staticSwap lowers the busiest GPU's load under static dispatch by
// swapping two experts' copies between it and another GPU (perNode > 0:
// one on the same node, which keeps every expert's nodes), best swap
// first, until no swap lowers it, maxSwaps swaps are made (negative: no
// bound) or m is done. With minGain > 0 a swap must also lower the
// busiest GPU of the layer by at least minGain (load over speed). Slot
// counts and the distinct GPUs of every expert's copies are kept. It
// returns the new copies (copies itself is not changed) and the swaps
// made.
func staticSwap(load []float64, copies [][]placement.GPU, speed []float64, src []float64, perNode, maxSwaps int, minGain float64, m *task.Meter) ([][]placement.GPU, int) {
	E, G := len(load), len(speed)
	cp := make([][]placement.GPU, E)
	on := make([][]int, G) // experts on each GPU
	for e, gs := range copies {
		cp[e] = slices.Clone(gs)
		for _, g := range gs {
			on[g] = append(on[g], e)
		}
	}
	gl := staticLoads(load, cp, speed, src)
	holds := func(e, g int) bool { return slices.Contains(cp[e], placement.GPU(g)) }
	// delta adds to d the load change on every GPU of e's copies when
	// the copy on from moves to to (touched lists the GPUs changed).
	d := make([]float64, G)
	var touched []int
	touch := func(g int, v float64) {
		if d[g] == 0 && !slices.Contains(touched, g) {
			touched = append(touched, g)
		}
		d[g] += v
	}
	moved := make([]placement.GPU, 0, G)
	delta := func(e, from, to int) {
		if load[e] == 0 {
			return
		}
		gs := cp[e]
		for _, g := range gs {
			touch(int(g), -load[e]*staticShare(gs, g, e, E, src)/speed[g])
		}
		moved = moved[:0]
		for _, g := range gs {
			if int(g) == from {
				g = placement.GPU(to)
			}
			moved = append(moved, g)
		}
		for _, g := range moved {
			touch(int(g), load[e]*staticShare(moved, g, e, E, src)/speed[g])
		}
	}
	const eps = 1e-12
	swaps := 0
	for iter := 0; maxSwaps < 0 || swaps < maxSwaps; iter++ {
		if (m.Work() || iter%8 == 0) && m.Done() {
			break
		}
		a := 0
		for g, v := range gl {
			if v > gl[a] {
				a = g
			}
		}
		peak := gl[a]
		bestMax, bestE, bestB, bestF := peak*(1-eps), -1, -1, -1
		tried := int64(0)
		for _, e := range on[a] {
			for b := range G {
				if b == a || (perNode > 0 && b/perNode != a/perNode) || holds(e, b) {
					continue
				}
				for _, f := range on[b] {
					if f == e || holds(f, a) {
						continue
					}
					tried++
					touched = touched[:0]
					delta(e, a, b)
					delta(f, b, a)
					worst := 0.0
					for _, g := range touched {
						worst = max(worst, gl[g]+d[g])
						d[g] = 0
					}
					if worst < bestMax {
						bestMax, bestE, bestB, bestF = worst, e, b, f
					}
				}
			}
		}
		m.Spend(tried)
		if bestE < 0 {
			break
		}
		touched = touched[:0]
		delta(bestE, a, bestB)
		delta(bestF, bestB, a)
		if minGain > 0 {
			// The layer's busiest GPU after the swap, wherever it is.
			after := 0.0
			for g, v := range gl {
				after = max(after, v+d[g])
			}
			if peak-after < minGain {
				for _, g := range touched {
					d[g] = 0
				}
				break
			}
		}
		for _, g := range touched {
			gl[g] += d[g]
			d[g] = 0
		}
		relocate(cp, on, bestE, a, bestB)
		relocate(cp, on, bestF, bestB, a)
		swaps++
	}
	return cp, swaps
}

// relocate moves expert e's copy on GPU from to GPU to, in its copies
// cp[e] and in the GPUs' experts on.
func relocate(cp [][]placement.GPU, on [][]int, e, from, to int) {
	for i, g := range cp[e] {
		if int(g) == from {
			cp[e][i] = placement.GPU(to)
		}
	}
	i := slices.Index(on[from], e)
	on[from] = slices.Delete(on[from], i, i+1)
	on[to] = append(on[to], e)
}

// staticFrom re-places layer l from the running plan's copies (p.Current,
// whose budget is b: Problem.MaxMoves and MoveCost) under static
// dispatch: the even-split search made improved, moving moves slots.
// Swaps under the static split continue from both, each within what is
// left of the budget (two slots a swap) and paying its charge for the two
// slots (perNode > 0: swaps within a node); the result with the lower
// busiest GPU, plus the charge for the slots it changes against the
// running plan, is returned, within the budget.
func staticFrom(p Problem, l int, b *costmodel.MoveBudget, running, improved [][]placement.GPU, moves int, speed, src []float64, perNode int, m *task.Meter) [][]placement.GPU {
	load := p.Stats.Load[l]
	total, sp := 0.0, 0.0
	for _, v := range load {
		total += v
	}
	for _, v := range speed {
		sp += v
	}
	mean := total / sp
	if mean <= 0 {
		return improved
	}
	swaps := func(used int) int {
		if n := b.Left(used); n >= 0 {
			return n / 2
		}
		return -1
	}
	minGain := b.Charge(2) * mean
	fromImproved, _ := staticSwap(load, improved, speed, src, perNode, swaps(moves), minGain, m)
	fromRunning, _ := staticSwap(load, running, speed, src, perNode, swaps(0), minGain, m)
	score := func(cp [][]placement.GPU) (float64, bool) {
		changed := b.Changed(cp)
		if !b.Allows(changed) {
			return 0, false
		}
		return slices.Max(staticLoads(load, cp, speed, src))/mean + b.Charge(changed), true
	}
	best, bestScore := improved, math.Inf(1)
	if s, ok := score(improved); ok {
		bestScore = s
	}
	for _, cp := range [][][]placement.GPU{fromImproved, fromRunning} {
		if s, ok := score(cp); ok && s < bestScore*(1-1e-12) {
			best, bestScore = cp, s
		}
	}
	return best
}
