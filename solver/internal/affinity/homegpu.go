package affinity

import (
	"context"
	"math"
	"slices"

	"github.com/moetuner/moetuner/solver/internal/task"
)

// The balance within nodes: packing, the GPU phase and its cheap swaps.

// repack spreads every node's copies over its GPUs largest first, each to
// the GPU with the fewest tokens that has a free slot and no copy of the
// expert yet (the longest-processing-time rule), and returns the new
// state; a node whose copies cannot be packed so keeps its GPUs.
func repack(s *state) *state {
	return repackNodes(s, false)
}

// repackNodes is repack; with singlesOnly the copies of replicated experts
// stay where they are and only single-copy experts are packed around them
// (which leaves a dealt table as it is: repairDealt).
func repackNodes(s *state, singlesOnly bool) *state {
	sh := s.ly.sh
	P := sh.P
	type cp struct {
		e    int
		load float64
	}
	cps := s.copies()
	out := make([][]int32, len(cps))
	byNode := make([][]cp, sh.N)
	free := make([]int, sh.G)
	load := make([]float64, sh.G)
	copy(free, sh.slots)
	for e, gs := range cps {
		for i, g := range gs {
			if singlesOnly && len(gs) > 1 {
				out[e] = append(out[e], g)
				free[g]--
				load[g] += s.cs[e].cl[i]
				continue
			}
			byNode[int(g)/P] = append(byNode[int(g)/P], cp{e, s.cs[e].cl[i]})
		}
	}
	for b, list := range byNode {
		slices.SortStableFunc(list, func(x, y cp) int {
			switch {
			case x.load > y.load:
				return -1
			case x.load < y.load:
				return 1
			}
			return x.e - y.e
		})
		put := make([]int, len(list))
		ok := true
		for k, c := range list {
			best := -1
			for g := b * P; g < (b+1)*P; g++ {
				if free[g] == 0 {
					continue
				}
				dup := false
				for kk := 0; kk < k; kk++ {
					if list[kk].e == c.e && put[kk] == g {
						dup = true
						break
					}
				}
				if dup {
					continue
				}
				if best < 0 || load[g]/sh.speed[g] < load[best]/sh.speed[best] {
					best = g
				}
			}
			if best < 0 {
				ok = false
				break
			}
			put[k] = best
			free[best]--
			load[best] += c.load
		}
		if !ok {
			for _, c := range list {
				for _, g := range cps[c.e] {
					if int(g)/P == b && !slices.Contains(out[c.e], g) {
						out[c.e] = append(out[c.e], g)
					}
				}
			}
			continue
		}
		for k, c := range list {
			out[c.e] = append(out[c.e], int32(put[k]))
		}
	}
	return newStateKappa(s.ly, out, s.kappa)
}

// gpuPhase balances GPUs within nodes: while some swap between a node's
// busiest GPU and another GPU of that node lowers the pair's larger load
// without raising the surrogate cost, the best such swap is made; the
// node with the busiest GPU goes first.
func (se *searcher) gpuPhase() {
	s := se.s
	sh := s.ly.sh
	P := sh.P
	load := sh.gpuCompute
	stuck := make([]bool, sh.N)
	scratch := make([]float64, sh.G)
	// Swaps of copies of replicated experts change how the dispatch
	// splits them, and pricing one walks their tokens: a node tries them
	// only once the swaps priced from loads alone (withinNode, O(1) each
	// and applied without a trial) and evenPair are exhausted there.
	slow := make([]bool, sh.N)
	for !se.m.Done() {
		top, tv := -1, -1.0
		for g := 0; g < sh.G; g++ {
			if v := load(g, s.tok); !stuck[g/P] && v > tv {
				top, tv = g, v
			}
		}
		if top < 0 {
			return
		}
		B := top / P
		var best move
		bestPeak, found := tv, false
		// The state holds still while the swaps are priced.
		now, base := s.costNow(levelGPU), s.baseCost()
		for ia := range s.held[top] {
			for g := B * P; g < (B+1)*P; g++ {
				if g == top {
					continue
				}
				for ib := range s.held[g] {
					mv := move{kind: moveSwap, a: top, ia: ia, b: g, ib: ib}
					if !se.ok(mv) {
						continue
					}
					if ta, tg, ok := s.withinNodeLoads(mv); ok && !(math.Max(sh.terms.Compute(top, ta, float64(sh.slots[top])), sh.terms.Compute(g, tg, float64(sh.slots[g]))) < bestPeak*(1-1e-12)) {
						// withinNode would price it and the peak
						// test below refuse it: counted, not priced.
						se.spend()
						continue
					}
					t2, d := s.withinNode(mv, scratch, base)
					if t2 == nil {
						if !slow[B] {
							continue
						}
						d, t2 = s.try(mv, levelGPU), s.tr.t2
					}
					se.spend()
					if d > 1e-15*now {
						continue
					}
					peak := math.Max(load(top, t2), load(g, t2))
					if peak < bestPeak*(1-1e-12) {
						best, bestPeak, found = mv, peak, true
					}
				}
			}
		}
		if !found {
			// No swap lowers the node's busiest GPU: even out another
			// pair of its GPUs, which may open one, before giving up.
			switch {
			case se.evenPair(B, scratch):
			case !slow[B] && !se.cheapOnly:
				slow[B] = true
			default:
				stuck[B] = true
			}
			continue
		}
		s.applyMove(best)
	}
}

// evenPair applies, among the swaps within node B that the GPU phase
// prices from loads alone (withinNode) and that do not raise the cost,
// the one that lowers the busier GPU of its pair the most, and reports
// whether there was one. A busiest GPU that no swap helps often has a
// partner that one would once the other GPUs are more even.
func (se *searcher) evenPair(B int, scratch []float64) bool {
	s := se.s
	sh := s.ly.sh
	P := sh.P
	load := sh.gpuCompute
	now, base := s.costNow(levelGPU), s.baseCost()
	var best move
	gain, found := 0.0, false
	for a := B * P; a < (B+1)*P && !se.m.Done(); a++ {
		for b := a + 1; b < (B+1)*P; b++ {
			before := math.Max(load(a, s.tok), load(b, s.tok))
			for ia := range s.held[a] {
				for ib := range s.held[b] {
					mv := move{kind: moveSwap, a: a, ia: ia, b: b, ib: ib}
					if !se.ok(mv) {
						continue
					}
					if ta, tb, ok := s.withinNodeLoads(mv); ok && !(before-math.Max(sh.terms.Compute(a, ta, float64(sh.slots[a])), sh.terms.Compute(b, tb, float64(sh.slots[b]))) > gain+1e-12*before) {
						se.spend()
						continue
					}
					t2, d := s.withinNode(mv, scratch, base)
					if t2 == nil {
						continue
					}
					se.spend()
					if d > 1e-15*now {
						continue
					}
					if g := before - math.Max(load(a, t2), load(b, t2)); g > gain+1e-12*before {
						best, gain, found = mv, g, true
					}
				}
			}
		}
	}
	if found {
		s.applyMove(best)
	}
	return found
}

// withinNode prices a swap of two experts of one copy each between GPUs
// of one node without walking their tokens: no token changes the nodes
// it reaches or the NIC port it uses (a port is the source's local index
// on the node), so only the two GPUs' tokens change, by the copies'
// loads. It returns the GPUs' tokens after the swap (in t2, G long) and
// the cost's change at the GPU level from base (s.baseCost()), the same
// numbers try gives; nil when the swap is not such a swap or NVLink is
// modeled (NVLink ports do see the GPU).
func (s *state) withinNode(mv move, t2 []float64, base float64) ([]float64, float64) {
	sh := s.ly.sh
	if sh.nv || mv.kind != moveSwap || mv.a/sh.P != mv.b/sh.P {
		return nil, 0
	}
	ta, tb, ok := s.withinNodeLoads(mv)
	if !ok {
		return nil, 0
	}
	copy(t2, s.tok)
	t2[mv.a], t2[mv.b] = ta, tb
	d := s.cost(t2, s.out, s.in, s.nvOut, s.nvIn, levelGPU) - base
	if b := s.ly.bud; b != nil {
		d += b.SlotSec * float64(s.dChanged(mv))
	}
	return t2, d
}

// withinNodeLoads is the tokens of mv's two GPUs after it, as withinNode
// and try sum them; false when withinNode does not price mv.
func (s *state) withinNodeLoads(mv move) (ta, tb float64, ok bool) {
	sh := s.ly.sh
	if sh.nv || mv.kind != moveSwap || mv.a/sh.P != mv.b/sh.P {
		return 0, 0, false
	}
	return s.swapLoads(mv)
}

// swapLoads is the tokens of mv's two GPUs after mv swaps two single-copy
// experts (each copy keeps its load), summed as try sums them; false
// when mv is not such a swap.
func (s *state) swapLoads(mv move) (ta, tb float64, ok bool) {
	if mv.kind != moveSwap {
		return 0, 0, false
	}
	ce, cf := &s.cs[s.held[mv.a][mv.ia]], &s.cs[s.held[mv.b][mv.ib]]
	if len(ce.gpus) != 1 || len(cf.gpus) != 1 {
		return 0, 0, false
	}
	// The sums in try's order: the first expert leaves a for b, then the
	// second leaves b for a.
	da, db := 0-ce.cl[0], 0+ce.cl[0]
	db -= cf.cl[0]
	da += cf.cl[0]
	return s.tok[mv.a] + da, s.tok[mv.b] + db, true
}

// applyMove applies mv: a swap withinNode prices is made on the GPUs'
// tokens and the two copies' GPUs alone (no token's nodes, ports, copy
// fractions or loads change), the same state apply leaves after a full
// trial; any other move goes through apply.
func (s *state) applyMove(mv move) {
	ta, tb, ok := s.withinNodeLoads(mv)
	if !ok {
		s.apply(mv)
		return
	}
	e, f := s.held[mv.a][mv.ia], s.held[mv.b][mv.ib]
	s.changed += s.dChanged(mv)
	s.tok[mv.a], s.tok[mv.b] = ta, tb
	s.cs[e].gpus[0], s.cs[f].gpus[0] = int32(mv.b), int32(mv.a)
	s.held[mv.a][mv.ia], s.held[mv.b][mv.ib] = f, e
	s.tr.valid = false
}

// baseCost is the state's cost at the GPU level without the move
// budget's charge: what try and withinNode price a move's change from.
func (s *state) baseCost() float64 {
	return s.cost(s.tok, s.out, s.in, s.nvOut, s.nvIn, levelGPU)
}

// gpuCompute is GPU g's compute time for its tokens in tok and its slots.
func (sh *shape) gpuCompute(g int, tok []float64) float64 {
	return sh.terms.Compute(g, tok[g], float64(sh.slots[g]))
}

// evenOut makes, in every node, the swaps of two single-copy experts that
// lower a GPU without raising the cost (the GPU phase's cheapest, priced
// from the GPUs' loads and applied without a trial: a swap within a node
// moves no token between nodes or NIC ports) until none is left or
// evenOutSweeps passes of every pair of a node's slots are spent, and
// returns the swaps it priced (none where NVLink is modeled).
func evenOut(ctx context.Context, s *state) int64 {
	sh := s.ly.sh
	if sh.nv || sh.P < 2 {
		// NVLink ports see a copy's GPU: no swap is priced from loads.
		return 0
	}
	S := slices.Max(sh.slots)
	se := &searcher{s: s, m: task.ByWork(ctx, int64(evenOutSweeps*sh.G*sh.P*S*S)), nodeLevel: levelNode, cheapOnly: true}
	se.gpuPhase()
	return se.tries
}

// evenOutSweeps bounds evenOut by work, not by the clock, so that a plan
// does not depend on the machine; it is a guard, not a limit the phase
// reaches: every swap it makes strictly lowers the sum of its node's
// squared loads, so it ends on its own. On the 32k DeepSeek-V3 trace (4 ×
// 8 GPUs, 32 slots, 5 s) it ended after 27,000 priced swaps a layer on
// average and 57,000 at most, against 2.07 million allowed.
const evenOutSweeps = 100
