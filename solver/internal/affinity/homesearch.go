package affinity

import (
	"cmp"
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/moetuner/moetuner/solver/internal/task"
)

// searcher improves one layer's state under a meter.
type searcher struct {
	s *state
	m *task.Meter
	// allow, when set, vetoes moves (move budgets, expert groups).
	allow           func(mv move) bool
	tries           int64
	nodeLevel       level
	applied, passes int
	// cheapOnly: the GPU phase makes only the swaps it prices from loads
	// alone (withinNode: one copy each, within a node), which leave every
	// dealt table as it is (repairDealt).
	cheapOnly bool
}

// spend charges one scored move.
func (se *searcher) spend() {
	se.tries++
	se.m.Spend(1)
}

func (se *searcher) ok(mv move) bool {
	return se.s.valid(mv) && (se.allow == nil || se.allow(mv))
}

// relocation is the estimated change of remote-node copies when the copy in
// slot ia of GPU a moves to node b.
type relocation struct {
	a, ia int
	dR    float64
}

// relocGains returns, per ordered node pair (A, B) at index A·N+B, the
// copies on A with the change of the sample's remote-node copies if each
// alone moved to a GPU of B that does not hold it (the one whose sources
// use the expert most), most negative first; nil when se's meter runs
// out before the single-copy experts are priced. The single-copy experts
// come first, read from the counters (singleReloc); the copies of
// replicated experts, each priced by a trial that walks the dispatch
// (two thirds of a pass on the 32k DeepSeek-V3 trace, 4 × 8 GPUs, 32
// slots), follow, and are left out when the meter runs out among them.
func (se *searcher) relocGains() [][]relocation {
	s := se.s
	sh := s.ly.sh
	N, P := sh.N, sh.P
	// gain[(slot)·N+B]: the relocation of a slot to B, in s.held order;
	// NaN where none was priced.
	off := make([]int, len(s.held)+1)
	for a, es := range s.held {
		off[a+1] = off[a] + len(es)
	}
	gain := make([]float64, off[len(s.held)]*N)
	for i := range gain {
		gain[i] = math.NaN()
	}
	dR := make([]float64, N)
	for a := range s.held {
		if se.m.Done() {
			// A pass prices every relocation, tens of the layer's
			// counter passes: under a short deadline it would run past
			// the phase, and the layers after it would pay. (Under a
			// work budget nothing is spent here, so the pass always
			// completes.)
			return nil
		}
		for ia, e := range s.held[a] {
			if len(s.cs[e].gpus) != 1 {
				continue
			}
			s.singleReloc(int(e), a/P, dR)
			for B := 0; B < N; B++ {
				if B != a/P {
					gain[(off[a]+ia)*N+B] = dR[B]
				}
			}
		}
	}
	tr := &s.tr
replicated:
	for a := range s.held {
		A := a / P
		for ia, e16 := range s.held[a] {
			e := int(e16)
			if len(s.cs[e].gpus) == 1 {
				continue
			}
			if se.m.Done() {
				break replicated
			}
			for B := 0; B < N; B++ {
				if B == A {
					continue
				}
				to := se.target(e, B)
				if to < 0 {
					continue
				}
				s.setChange(&tr.ch[0], e, a, to)
				tr.nch = 1
				tr.valid = false
				s.tokenDeltas(false)
				gain[(off[a]+ia)*N+B] = tr.dR
			}
		}
	}
	out := make([][]relocation, N*N)
	for a := range s.held {
		A := a / P
		for ia := range s.held[a] {
			for B := 0; B < N; B++ {
				if d := gain[(off[a]+ia)*N+B]; B != A && !math.IsNaN(d) {
					out[A*N+B] = append(out[A*N+B], relocation{a: a, ia: ia, dR: d})
				}
			}
		}
	}
	for i := range out {
		slices.SortFunc(out[i], func(x, y relocation) int { return cmp.Compare(x.dR, y.dR) })
	}
	return out
}

// singleReloc sets dR[B], for every node B, to the change of the sample's
// remote-node copies if e, whose one copy sits on node A, alone moved to
// a GPU of B: the number tokenDeltas gives for that move, read from the
// counters without walking the dispatch (one copy serves every source,
// so each of e's tokens stops reaching A through it and reaches B), one
// pass over e's tokens for all the nodes at once.
func (s *state) singleReloc(e, A int, dR []float64) {
	sh := s.ly.sh
	N, P := sh.N, sh.P
	clear(dR)
	for h := 0; h < sh.G; h++ {
		home := h / P
		for _, t32 := range s.ly.tokensFrom(e, h) {
			t := int(t32)
			z, pr := s.z[t*N:(t+1)*N], s.pr[t*N:(t+1)*N]
			w := sh.w[t]
			lose := 0.0
			if A != home {
				lose = used(z[A]-1, pr[A]) - used(z[A], pr[A])
			}
			for B := 0; B < N; B++ {
				if B == A {
					continue
				}
				d := lose
				if B != home {
					d += used(z[B]+1, pr[B]) - used(z[B], pr[B])
				}
				dR[B] += w * d
			}
		}
	}
}

// target is the GPU on node B not holding e whose tokens use e most, or −1.
func (se *searcher) target(e, B int) int {
	s := se.s
	sh := s.ly.sh
	best, bv := -1, -1.0
	for g := B * sh.P; g < (B+1)*sh.P; g++ {
		if s.holds(g, e) {
			continue
		}
		if v := s.ly.srcShare(g, e); v > bv {
			best, bv = g, v
		}
	}
	return best
}

// pairItem is a candidate swap between list x of node pair (A, B) and list
// y of (B, A).
type pairItem struct {
	p    int // node pair index A·N+B, A < B
	i, j int
	key  float64
}

type pairHeap []pairItem

func (h pairHeap) Len() int           { return len(h) }
func (h pairHeap) Less(i, j int) bool { return h[i].key < h[j].key }
func (h pairHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)        { *h = append(*h, x.(pairItem)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// nodePhase swaps copies between nodes: candidates come in order of their
// estimated saving (the two relocations' sum), each is scored exactly on
// the node-level surrogate and applied when it lowers it. A pass ends when
// the estimates promise nothing more or a layer's worth of slots in a row
// were refused; passes repeat with fresh estimates while they gain.
func (se *searcher) nodePhase() {
	s := se.s
	sh := s.ly.sh
	N := sh.N
	if N < 2 {
		return
	}
	slotsN := 0
	for _, v := range sh.slots {
		slotsN += v
	}
	for !se.m.Done() {
		gains := se.relocGains()
		if gains == nil {
			if se.passes == 0 {
				sh.nodesCut.Store(true)
			}
			return
		}
		h := &pairHeap{}
		for A := 0; A < N; A++ {
			for B := A + 1; B < N; B++ {
				x, y := gains[A*N+B], gains[B*N+A]
				if len(x) > 0 && len(y) > 0 {
					heap.Push(h, pairItem{p: A*N + B, key: x[0].dR + y[0].dR})
				}
			}
		}
		applied, refused := 0, 0
		se.passes++
		for h.Len() > 0 && refused < slotsN && !se.m.Done() {
			it := heap.Pop(h).(pairItem)
			if it.key >= 0 {
				break
			}
			A, B := it.p/N, it.p%N
			x, y := gains[A*N+B], gains[B*N+A]
			if it.j+1 < len(y) {
				heap.Push(h, pairItem{p: it.p, i: it.i, j: it.j + 1, key: x[it.i].dR + y[it.j+1].dR})
			}
			if it.j == 0 && it.i+1 < len(x) {
				heap.Push(h, pairItem{p: it.p, i: it.i + 1, j: 0, key: x[it.i+1].dR + y[0].dR})
			}
			ra, rb := x[it.i], y[it.j]
			mv := move{kind: moveSwap, a: ra.a, ia: ra.ia, b: rb.a, ib: rb.ia}
			if !se.ok(mv) {
				continue
			}
			d := s.try(mv, se.nodeLevel)
			se.spend()
			if d < -1e-15*math.Abs(s.costNow(se.nodeLevel)) {
				s.apply(mv)
				applied++
				se.applied++
				refused = 0
			} else {
				refused++
			}
		}
		if applied == 0 {
			return
		}
	}
}

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

// anneal runs simulated annealing on the exact surrogate at lv until sc
// ends: random swaps (across nodes and within them) and retargets, from the
// mean |Δ| of the first moves times hot cooling to coolTo of that. Every accepted move
// keeps the state valid; the caller compares the result with what it
// started from.
func (se *searcher) anneal(rng *rand.Rand, sc *schedule, lv level, hot float64) {
	s := se.s
	sh := s.ly.sh
	G := sh.G
	// Under a full move budget a random move is mostly refused: half the
	// moves then start from a changed slot, and half of their partners
	// are changed slots too (a swap of two changed slots never adds to
	// the count; one back to the running plan frees the budget).
	bud := s.ly.bud
	pick := func() (move, bool) {
		for range 64 {
			a := rng.IntN(G)
			if sh.cap.On() && rng.IntN(2) == 0 {
				// Above the cap only a move off the busiest GPU lowers
				// its charge: half the picks start there while it is.
				if g := s.busiestOverCap(); g >= 0 {
					a = g
				}
			}
			full := bud != nil && bud.Max > 0 && s.changed >= bud.Max-1
			var ia int
			if full && rng.IntN(2) == 0 {
				var ok bool
				if a, ia, ok = s.changedSlot(rng); !ok {
					continue
				}
			} else {
				if len(s.held[a]) == 0 {
					continue
				}
				ia = rng.IntN(len(s.held[a]))
			}
			mv := move{kind: moveSwap, a: a, ia: ia}
			// One retarget in every slots-per-GPU moves: re-apportioning
			// copies is as likely as moving any one slot of a GPU
			// (none where the copy counts are kept: shape.keepCounts).
			if !sh.keepCounts && rng.IntN(len(s.held[a])+1) == 0 {
				mv.kind, mv.f = moveRetarget, rng.IntN(sh.E)
			} else if full && rng.IntN(2) == 0 {
				b, ib, ok := s.changedSlot(rng)
				if !ok {
					continue
				}
				mv.b, mv.ib = b, ib
			} else {
				mv.b = rng.IntN(G)
				if len(s.held[mv.b]) == 0 {
					continue
				}
				mv.ib = rng.IntN(len(s.held[mv.b]))
			}
			if se.ok(mv) {
				return mv, true
			}
		}
		return move{}, false
	}
	t0, n0 := 0.0, 0
	s.capOff = true // the cap's charge would set a temperature it then melts
	for range 4 * G {
		mv, ok := pick()
		if !ok {
			break
		}
		t0 += math.Abs(s.try(mv, lv))
		se.tries++
		n0++
	}
	s.capOff = false
	if n0 == 0 || t0 == 0 {
		return
	}
	t0 *= hot / float64(n0)
	// The best state seen is kept: as a copy taken when the walk first
	// leaves it uphill (atBest: the current state is the best).
	cur := s.costNow(lv)
	best, atBest := cur, true
	var bestAt [][]int32
	defer func() {
		if !atBest && bestAt != nil && best < cur {
			*s = *newStateKappa(s.ly, bestAt, s.kappa)
		}
	}()
	for {
		p, ok := sc.next()
		if !ok {
			return
		}
		mv, ok := pick()
		if !ok {
			return
		}
		d := s.try(mv, lv)
		se.tries++
		if d <= 0 || rng.Float64() < math.Exp(-d/(t0*math.Pow(coolTo, p))) {
			if atBest && d > 0 {
				bestAt = s.copies()
				atBest = false
				s.try(mv, lv) // the trial the copy may have disturbed
			}
			s.apply(mv)
			se.applied++
			cur += d
			if cur < best*(1-1e-12) || (atBest && cur <= best) {
				best, atBest = cur, true
			}
		}
	}
}

// changedSlot returns a slot, uniformly at random, whose copy the running
// plan does not have there (false when none or without a budget).
func (s *state) changedSlot(rng *rand.Rand) (g, i int, ok bool) {
	b := s.ly.bud
	if b == nil || s.changed == 0 {
		return 0, 0, false
	}
	n := rng.IntN(s.changed)
	for g, es := range s.held {
		for i, e := range es {
			if b.Off(g, int(e)) == 1 {
				if n == 0 {
					return g, i, true
				}
				n--
			}
		}
	}
	return 0, 0, false
}
