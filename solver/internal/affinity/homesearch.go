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
	// exact: capDescent makes only the moves the dispatch prices exactly
	// (state.closedForm stays clear).
	exact bool
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
	return se.gains(true)
}

// gains is relocGains, with the replicated experts' copies left out
// unless replicated is set.
func (se *searcher) gains(replicated bool) [][]relocation {
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
trials:
	for a := range s.held {
		if !replicated {
			break
		}
		A := a / P
		for ia, e16 := range s.held[a] {
			e := int(e16)
			if len(s.cs[e].gpus) == 1 {
				continue
			}
			if se.m.Done() {
				break trials
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
				lose = leaves(z, pr, A)
			}
			for B := 0; B < N; B++ {
				if B == A {
					continue
				}
				d := lose
				if B != home {
					d += joins(z, pr, B)
				}
				dR[B] += w * d
			}
		}
	}
}

// leaves is the change of a token's chance to reach node b when one of
// its certain experts there moves away (z and pr its counters per node).
func leaves(z []uint8, pr []float64, b int) float64 {
	return used(z[b]-1, pr[b]) - used(z[b], pr[b])
}

// joins is the change when a certain expert of the token arrives on b.
func joins(z []uint8, pr []float64, b int) float64 {
	return used(z[b]+1, pr[b]) - used(z[b], pr[b])
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
		for !se.m.Done() && se.balanceSwap(gains) {
			applied++
		}
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
			d := s.price(mv, se.nodeLevel)
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

// balanceSwap makes one swap between the busiest node and another that
// lowers the node-level cost, if it finds one, and reports whether it
// did. The candidates are the pairs of the pass's relocations (gains)
// between the busiest node A and a node B whose swap moves load off A
// without making B the new busiest; they are ordered by their estimated
// change of the cost, the relocations' remote copies at the mean NIC
// port's price plus the busiest node's compute it saves, and priced
// exactly in that order until one lowers the cost or a node's slots in a
// row were refused. The node phase's heap orders swaps by the cut alone
// and never tries one that sends more copies; a swap that sends a few
// more to even the nodes out is found here.
func (se *searcher) balanceSwap(gains [][]relocation) bool {
	s := se.s
	sh := s.ly.sh
	N, P := sh.N, sh.P
	nl := make([]float64, N)
	sp := make([]float64, N)
	for g, x := range s.tok {
		nl[g/P] += x
		sp[g/P] += sh.speed[g]
	}
	A := 0
	for b := range nl {
		if nl[b]/sp[b] > nl[A]/sp[A] {
			A = b
		}
	}
	load := func(r relocation) float64 {
		e := s.held[r.a][r.ia]
		return s.cs[e].cl[slices.Index(s.cs[e].gpus, int32(r.a))]
	}
	perCopy, perTok := 2*sh.copySec/float64(sh.G), sh.perTok
	type cand struct {
		mv  move
		est float64
	}
	var cands []cand
	for B := 0; B < N; B++ {
		if B == A {
			continue
		}
		others := 0.0
		for c := range nl {
			if c != A && c != B {
				others = math.Max(others, nl[c]/sp[c])
			}
		}
		for _, x := range gains[A*N+B] {
			lx := load(x)
			for _, y := range gains[B*N+A] {
				dl := lx - load(y)
				if dl <= 0 || nl[B]+dl >= nl[A] {
					continue
				}
				peak := math.Max(others, math.Max((nl[A]-dl)/sp[A], (nl[B]+dl)/sp[B]))
				est := (x.dR+y.dR)*perCopy + (peak-nl[A]/sp[A])*perTok
				if est < 0 {
					cands = append(cands, cand{move{kind: moveSwap, a: x.a, ia: x.ia, b: y.a, ib: y.ia}, est})
				}
			}
		}
	}
	slices.SortFunc(cands, func(x, y cand) int { return cmp.Compare(x.est, y.est) })
	limit := len(s.held[0]) * P
	for i, c := range cands {
		if i >= limit || se.m.Done() {
			break
		}
		if !se.ok(c.mv) {
			continue
		}
		d := s.price(c.mv, se.nodeLevel)
		se.spend()
		if d < -1e-15*math.Abs(s.costNow(se.nodeLevel)) {
			s.apply(c.mv)
			se.applied++
			return true
		}
	}
	return false
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
		t0 += math.Abs(s.price(mv, lv))
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
		d := s.price(mv, lv)
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
