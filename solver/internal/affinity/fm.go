package affinity

import (
	"cmp"
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/moetuner/moetuner/costmodel"
)

// The node cut as a hypergraph: every sampled token is a hyperedge over
// the nodes its experts' copies serve it on plus its home node, weighted
// by the token's count, and its remote-node copies are its connectivity
// minus one (λ − 1). The state's counters are the hyperedges' pin counts:
// per token and node the certain copies (z) and the product of the
// uncertain ones' misses (pr), so that a token reaches node b with
// probability used(z, pr). fmRefiner keeps, for every copy and every node
// it could move to, the exact change of the sample's remote copies that
// relocation alone would make (its gain), and updates the gains when a
// move changes pins instead of pricing moves afresh: a k-way
// Fiduccia–Mattheyses refinement in the way of the hypergraph
// partitioners' gain caches (Sanchis's k-way FM; KaHyPar's gain cache),
// whose moves are swaps of two copies between nodes because every GPU's
// slots are fixed.
//
// A token's contribution to a relocation's gain is a sum over the nodes
// whose fraction of the expert changes, each term depending only on the
// token's pins at that node; so when a move changes a token's pins at
// node b, only the terms at b of the other experts of that token change,
// and those are updated in O(1) each (an expert with one copy, which is
// certain on its node: a term for leaving its node and one for arriving
// at each other node) or per factor (an expert with copies, whose split
// the dispatch decides).

// fmExpert is one expert's cached gains.
type fmExpert struct {
	// single: one copy, on node C. Its relocation to node B (≠ C) changes
	// the sample's remote copies by leave + arrive[B]: leave sums, over
	// its tokens homed away from C, what C loses (the token leaves C when
	// this is its only pin there), arrive[B] what B gains over the tokens
	// homed away from B.
	single bool
	C      int
	leave  float64
	arrive []float64 // N
	// With copies: gain[i·N+B] is the change if copy i (of the expert's
	// sorted GPUs) alone moved to tgt[i·N+B] (+Inf where no GPU of node B
	// can take it, and for B its own node); fac holds, per (i, B) and
	// source h, the factors that relocation applies to a token's pins:
	// fac[off[(k·G+h)]:off[k·G+h+1]] with k = i·N+B.
	gain []float64
	tgt  []int32
	off  []int32
	fac  []factor
}

// fmRefiner is the gain-cached refinement of one layer's node cut.
type fmRefiner struct {
	se   *searcher
	s    *state
	N, G int
	ex   []fmExpert
	// zm and pm mirror the state's pins as the gains last saw them.
	zm    []uint8
	pm    []float64
	stamp []uint32
	gen   uint32
	ch    change
	// marked is the expert whose tokens carry the stamp mark (overlap).
	marked int
	mark   uint32
	// locked marks slots (per GPU, by index) moved in this pass.
	locked [][]bool
	// nodeCap bounds every node's mean GPU (tokens per unit of speed over
	// the mean) during the refinement: the start's node balance, or
	// fmNodeSlack above even when that is looser.
	nodeCap costmodel.Cap
	// copySec is what one remote copy of the sample adds to the layer
	// time through the mean NIC port (both phases), so that a move
	// budget's charge and copies are weighed in one unit.
	copySec float64
	// stall is how many moves in a row a pass may make without beating
	// its best before it stops and rolls back to that best (0: only
	// improving moves).
	stall int
	// first, when positive, takes the first priced swap that gains at
	// least first times its estimate instead of the best.
	first float64
	// noUpdate leaves the gains as they were after a move (tests: the
	// recount must catch it).
	noUpdate bool
	// moves and passes count what the refinement did.
	moves, passes int
}

// fmNodeSlack is how far above the mean a node's load may go during the
// refinement when the start is balanced tighter than that. None: on the
// 32k trace (layers 0, 10, …, 50, 1.5 s a layer) a slack of 0.005 or
// 0.002 cut as many copies (−6.0, −5.8 % against −5.9 %) but left the
// layers slower (−3.29, −3.26 % layer time against −3.52 %).
const fmNodeSlack = 0

// fmStall is the default stall: improving moves only. On the 32k
// DeepSeek-V3 trace (4 × 8, 32 slots, static-mean, layers 0, 10 and 30,
// run to convergence from EPLB's plan) passes that could climb 16 moves
// reached −7.1, −7.2 and −6.7 % remote copies against −7.0, −6.9 and
// −6.4 % for the descents, in two to five times the time; the kicks
// between descents (run) leave local optima more cheaply.
const fmStall = 0

// fmCandidates is how many candidate swaps a step prices exactly at most,
// and fmTries how many of them may be swaps of a replicated expert's copy
// (priced by walking both experts' tokens, where two single copies are
// priced from their gains and the tokens they share). The estimates rank
// the exact gains loosely: on the same layers 8 candidates, 4 of them
// replicated, stopped the descents at −2.0 to −2.8 % where 64 reached
// −6.4 to −7.0 %.
const (
	fmCandidates = 64
	fmTries      = 16
)

// newFM builds the refinement of se's state, its gains counted from the
// pins.
func newFM(se *searcher) *fmRefiner {
	s := se.s
	sh := s.ly.sh
	N, G := sh.N, sh.G
	f := &fmRefiner{se: se, s: s, N: N, G: G, ex: make([]fmExpert, sh.E), stall: fmStall}
	f.zm = slices.Clone(s.z)
	f.pm = slices.Clone(s.pr)
	f.stamp = make([]uint32, sh.T)
	f.ch.dOff = make([]int32, G+1)
	if sh.nv {
		f.ch.gOff = make([]int32, G+1)
	}
	f.locked = make([][]bool, G)
	for g := range f.locked {
		f.locked[g] = make([]bool, len(s.held[g]))
	}
	f.copySec = 2 * sh.copySec / float64(G)
	nb := costmodel.Balance(f.nodeLoads(s.tok), f.nodeSpeeds())
	f.nodeCap = costmodel.Cap{Max: math.Max(nb, 1+fmNodeSlack)}
	for e := range f.ex {
		f.recompute(e)
	}
	return f
}

// nodeLoads sums tok per node.
func (f *fmRefiner) nodeLoads(tok []float64) []float64 {
	P := f.s.ly.sh.P
	out := make([]float64, f.N)
	for g, x := range tok {
		out[g/P] += x
	}
	return out
}

func (f *fmRefiner) nodeSpeeds() []float64 {
	return f.nodeLoads(f.s.ly.sh.speed)
}

// leaveTerm is what a token with pins (z, pr) at a node loses there when
// a certain copy leaves: −pr when it is the only certain one, else 0.
func leaveTerm(z uint8, pr float64) float64 { return used(z-1, pr) - used(z, pr) }

// arriveTerm is what it gains when a certain copy arrives: pr when none
// was certain, else 0.
func arriveTerm(z uint8, pr float64) float64 { return used(z+1, pr) - used(z, pr) }

// factorTerm is what a token with pins (z, pr) at a node gains when
// factor fa applies there.
func factorTerm(z uint8, pr float64, fa factor) float64 {
	return used(uint8(int(z)+int(fa.dz)), pr*fa.mul) - used(z, pr)
}

// recompute counts expert e's gains afresh from the pins (and, with
// copies, its relocations' factors).
func (f *fmRefiner) recompute(e int) {
	s := f.s
	ly, sh := s.ly, s.ly.sh
	N, G, P := f.N, f.G, sh.P
	x := &f.ex[e]
	gpus := s.cs[e].gpus
	if len(gpus) == 1 {
		x.single, x.C = true, int(gpus[0])/P
		x.leave = 0
		x.arrive = slices.Grow(x.arrive[:0], N)[:N]
		clear(x.arrive)
		C := x.C
		for h := 0; h < G; h++ {
			H := h / P
			for _, t32 := range ly.tokensFrom(e, h) {
				t := int(t32)
				w := sh.w[t]
				k := t * N
				if C != H {
					x.leave += w * leaveTerm(s.z[k+C], s.pr[k+C])
				}
				for B := 0; B < N; B++ {
					if B != C && B != H {
						x.arrive[B] += w * arriveTerm(s.z[k+B], s.pr[k+B])
					}
				}
			}
		}
		return
	}
	x.single = false
	n := len(gpus)
	x.gain = slices.Grow(x.gain[:0], n*N)[:n*N]
	x.tgt = slices.Grow(x.tgt[:0], n*N)[:n*N]
	x.off = slices.Grow(x.off[:0], n*N*G+1)[:n*N*G+1]
	x.fac = x.fac[:0]
	for i, g := range gpus {
		A := int(g) / P
		for B := 0; B < N; B++ {
			k := i*N + B
			x.gain[k], x.tgt[k] = math.Inf(1), -1
			for h := 0; h < G; h++ {
				x.off[k*G+h] = int32(len(x.fac))
			}
			if B == A {
				continue
			}
			to := f.se.target(e, B)
			if to < 0 {
				continue
			}
			x.tgt[k] = int32(to)
			s.setChange(&f.ch, e, int(g), to)
			sum := 0.0
			for h := 0; h < G; h++ {
				x.off[k*G+h] = int32(len(x.fac))
				x.fac = factors(x.fac, h, N, &f.ch)
				fs := x.fac[x.off[k*G+h]:]
				if len(fs) == 0 {
					continue
				}
				H := h / P
				for _, t32 := range ly.tokensFrom(e, h) {
					t := int(t32)
					w := sh.w[t]
					for _, fa := range fs {
						if b := int(fa.b); b != H {
							kk := t*N + b
							sum += w * factorTerm(s.z[kk], s.pr[kk], fa)
						}
					}
				}
			}
			x.gain[k] = sum
		}
	}
	x.off[n*N*G] = int32(len(x.fac))
	f.ch.old = nil
}

// gainOf is the cached gain of moving copy i of e to node B (+Inf when it
// cannot go there).
func (f *fmRefiner) gainOf(e, i, B int) float64 {
	x := &f.ex[e]
	if x.single {
		if B == x.C {
			return math.Inf(1)
		}
		return x.leave + x.arrive[B]
	}
	return x.gain[i*f.N+B]
}

// update moves the gains of the experts of token t (except skip0 and
// skip1) from its pins at node b as they were (oz, op) to what they are.
func (f *fmRefiner) update(t, b int, oz uint8, op float64, skip0, skip1 int) {
	s := f.s
	sh := s.ly.sh
	N, P, K := f.N, sh.P, sh.K
	h := int(sh.src[t])
	if b == h/P {
		return // a token's home is never remote
	}
	k := t*N + b
	nz, np := s.z[k], s.pr[k]
	w := sh.w[t]
	for _, e16 := range s.ly.ex[t*K : (t+1)*K] {
		e := int(e16)
		if e == skip0 || e == skip1 {
			continue
		}
		x := &f.ex[e]
		if x.single {
			if b == x.C {
				x.leave += w * (leaveTerm(nz, np) - leaveTerm(oz, op))
			} else {
				x.arrive[b] += w * (arriveTerm(nz, np) - arriveTerm(oz, op))
			}
			continue
		}
		G := f.G
		for kk := range x.gain {
			if x.tgt[kk] < 0 {
				continue
			}
			j := kk*G + h
			for _, fa := range x.fac[x.off[j]:x.off[j+1]] {
				if int(fa.b) == b {
					x.gain[kk] += w * (factorTerm(nz, np, fa) - factorTerm(oz, op, fa))
				}
			}
		}
	}
}

// apply makes swap mv (valid, as the last tried or not) and brings the
// gains up to date.
func (f *fmRefiner) apply(mv move) {
	s := f.s
	ly := s.ly
	N, G := f.N, f.G
	e0, e1 := int(s.held[mv.a][mv.ia]), int(s.held[mv.b][mv.ib])
	s.apply(mv)
	f.moves++
	f.gen++
	if f.gen == 0 {
		clear(f.stamp)
		f.gen = 1
	}
	for _, e := range [2]int{e0, e1} {
		for h := 0; h < G; h++ {
			for _, t32 := range ly.tokensFrom(e, h) {
				t := int(t32)
				if f.stamp[t] == f.gen {
					continue
				}
				f.stamp[t] = f.gen
				for b := 0; b < N; b++ {
					k := t*N + b
					oz, op := f.zm[k], f.pm[k]
					if oz == s.z[k] && op == s.pr[k] {
						continue
					}
					if !f.noUpdate {
						f.update(t, b, oz, op, e0, e1)
					}
					f.zm[k], f.pm[k] = s.z[k], s.pr[k]
				}
			}
		}
	}
	f.recompute(e0)
	f.recompute(e1)
}

// fmCand is a relocation on the candidate lists: the copy in slot ia of
// GPU a and its cached gain.
type fmCand struct {
	a, ia int
	g     float64
}

// lists returns, per ordered node pair (A, B) at A·N+B, the unlocked
// copies on A that can move to B, best gain first. A linear pass over the
// layer's slots (a few hundred, each priced in O(1) from the cache) finds
// them: cheaper than keeping buckets ordered through the thousands of
// gain updates each move makes.
func (f *fmRefiner) lists() [][]fmCand {
	s := f.s
	P := s.ly.sh.P
	N := f.N
	out := make([][]fmCand, N*N)
	for a, es := range s.held {
		A := a / P
		for ia, e16 := range es {
			if f.locked[a][ia] {
				continue
			}
			e := int(e16)
			i := slices.Index(s.cs[e].gpus, int32(a))
			for B := 0; B < N; B++ {
				if B == A {
					continue
				}
				if g := f.gainOf(e, i, B); !math.IsInf(g, 1) {
					out[A*N+B] = append(out[A*N+B], fmCand{a: a, ia: ia, g: g})
				}
			}
		}
	}
	for i := range out {
		slices.SortFunc(out[i], func(x, y fmCand) int { return cmp.Compare(x.g, y.g) })
	}
	return out
}

// objective is the refinement's measure of the state: its remote copies
// in seconds of the mean NIC port, plus the move budget's charge.
func (f *fmRefiner) objective() float64 {
	c := f.s.remote() * f.copySec
	if b := f.s.ly.bud; b != nil {
		c += b.Charge(f.s.changed)
	}
	return c
}

// fits reports whether the last tried move keeps every node within the
// refinement's cap and does not add to the problem's cap excess at the
// node level.
func (f *fmRefiner) fits() bool {
	s := f.s
	sh := s.ly.sh
	t2 := s.tr.t2
	if f.nodeCap.Excess(t2, sh.speed, sh.P) > 0 {
		return false
	}
	if sh.cap.On() {
		return sh.cap.Excess(t2, sh.speed, sh.P) <= sh.cap.Excess(s.tok, sh.speed, sh.P)*(1+1e-12)
	}
	return true
}

// best returns the best swap of unlocked copies between two nodes that
// fits: candidates in order of their estimate (the two relocations'
// cached gains), each priced exactly (try), at most fmCandidates of them;
// the search stops early when the next estimate cannot beat the best
// priced (the estimate is optimistic for copies of single-copy experts:
// tokens that use both experts are counted as if each moved alone).
func (f *fmRefiner) best() (move, float64, bool) {
	s := f.s
	N := f.N
	ls := f.lists()
	h := &pairHeap{}
	for A := 0; A < N; A++ {
		for B := A + 1; B < N; B++ {
			x, y := ls[A*N+B], ls[B*N+A]
			if len(x) > 0 && len(y) > 0 {
				heap.Push(h, pairItem{p: A*N + B, key: x[0].g + y[0].g})
			}
		}
	}
	// The nodes' loads after a swap of two single-copy experts are known
	// without pricing it: such swaps that break the bound are skipped.
	sh := s.ly.sh
	nl, ns := f.nodeLoads(s.tok), f.nodeSpeeds()
	tot, stot := 0.0, 0.0
	for b := range nl {
		tot, stot = tot+nl[b], stot+ns[b]
	}
	limit := f.nodeCap.Max * (1 + costmodel.CapTol) * tot / stot
	if sh.cap.On() && sh.cap.Excess(s.tok, sh.speed, sh.P) == 0 {
		limit = math.Min(limit, sh.cap.Max*(1+costmodel.CapTol)*tot/stot)
	}
	over := func(e, fx, A, B int) bool {
		if !f.ex[e].single || !f.ex[fx].single {
			return false
		}
		d := s.ly.load[e] - s.ly.load[fx]
		return (nl[A]-d)/ns[A] > limit && d < 0 || (nl[B]+d)/ns[B] > limit && d > 0
	}
	var bestMv move
	bestD, found, priced := math.Inf(1), false, 0
	seen, tried := 0, 0
	f.marked = -1
	for h.Len() > 0 && priced < fmCandidates && seen < 64*fmCandidates && !f.se.m.Done() {
		it := heap.Pop(h).(pairItem)
		if found && it.key*f.copySec >= bestD {
			break
		}
		A, B := it.p/N, it.p%N
		x, y := ls[A*N+B], ls[B*N+A]
		if it.j+1 < len(y) {
			heap.Push(h, pairItem{p: it.p, i: it.i, j: it.j + 1, key: x[it.i].g + y[it.j+1].g})
		}
		if it.j == 0 && it.i+1 < len(x) {
			heap.Push(h, pairItem{p: it.p, i: it.i + 1, j: 0, key: x[it.i+1].g + y[0].g})
		}
		seen++
		ra, rb := x[it.i], y[it.j]
		mv := move{kind: moveSwap, a: ra.a, ia: ra.ia, b: rb.a, ib: rb.ia}
		if over(int(s.held[ra.a][ra.ia]), int(s.held[rb.a][rb.ia]), A, B) || !f.se.ok(mv) {
			continue
		}
		f.se.spend()
		priced++
		var dR float64
		if e0, e1 := int(s.held[ra.a][ra.ia]), int(s.held[rb.a][rb.ia]); f.ex[e0].single && f.ex[e1].single {
			dR = ra.g + rb.g + f.overlap(e0, e1)
		} else {
			if tried >= fmTries {
				continue
			}
			tried++
			s.try(mv, levelNode)
			if !f.fits() {
				continue
			}
			dR = s.tr.dR
		}
		d := dR * f.copySec
		if b := s.ly.bud; b != nil {
			d += b.SlotSec * float64(s.dChanged(mv))
		}
		if d < bestD {
			bestMv, bestD, found = mv, d, true
			if f.first > 0 && d < 0 && d <= f.first*it.key*f.copySec {
				break
			}
		}
	}
	return bestMv, bestD, found
}

// run refines until the meter ends: descents to a local optimum of the
// swaps, then, while the meter lasts, kicks of a few random fitting swaps
// each followed by a descent, keeping the best plan seen (an iterated
// local search: the descents alone stop at the first optimum of their
// swaps). The state ends at the best plan seen.
func (f *fmRefiner) run() {
	s := f.s
	f.descend()
	if f.se.m.Done() {
		return
	}
	best, bestAt := f.objective(), s.copies()
	rng := rand.New(rand.NewPCG(uint64(s.ly.l), 0x666d))
	for !f.se.m.Done() {
		if f.kick(rng, fmKick) == 0 {
			break
		}
		f.descend()
		switch cur := f.objective(); {
		case cur < best-fmTol(best):
			best, bestAt = cur, s.copies()
		case cur > best+fmTol(best):
			f.reset(bestAt)
		}
	}
	if f.objective() > best+fmTol(best) {
		f.reset(bestAt)
	}
}

// fmKick is how many random swaps a kick makes.
const fmKick = 3

func fmTol(v float64) float64 { return 1e-12 * math.Max(math.Abs(v), 1e-30) }

// kick makes up to n random swaps of copies between nodes that the
// bounds allow and returns how many it made (each draw is charged).
func (f *fmRefiner) kick(rng *rand.Rand, n int) int {
	s := f.s
	G, P := f.G, s.ly.sh.P
	done := 0
	for tries := 0; done < n && tries < 64*n && !f.se.m.Done(); tries++ {
		f.se.spend()
		a, b := rng.IntN(G), rng.IntN(G)
		if a/P == b/P || len(s.held[a]) == 0 || len(s.held[b]) == 0 {
			continue
		}
		mv := move{kind: moveSwap, a: a, ia: rng.IntN(len(s.held[a])), b: b, ib: rng.IntN(len(s.held[b]))}
		if !f.se.ok(mv) {
			continue
		}
		s.try(mv, levelNode)
		if f.fits() {
			f.apply(mv)
			done++
		}
	}
	return done
}

// reset puts the state at copies and counts the gains afresh.
func (f *fmRefiner) reset(copies [][]int32) {
	s := f.s
	*s = *newStateKappa(s.ly, copies, s.kappa)
	copy(f.zm, s.z)
	copy(f.pm, s.pr)
	for e := range f.ex {
		f.recompute(e)
	}
}

// descend runs passes until one gains nothing or the meter ends: each
// pass takes the best fitting swap of unlocked copies and locks both;
// with stall it also takes swaps that lose, and after stall moves without
// a new best rolls back to its best.
func (f *fmRefiner) descend() {
	for !f.se.m.Done() {
		f.passes++
		for g := range f.locked {
			clear(f.locked[g])
		}
		start := f.objective()
		best, cur := start, start
		var hist []move
		bestLen := 0
		for !f.se.m.Done() {
			mv, d, ok := f.best()
			if !ok || (f.stall == 0 && d >= -fmTol(cur)) {
				break
			}
			f.apply(mv)
			f.locked[mv.a][mv.ia], f.locked[mv.b][mv.ib] = true, true
			hist = append(hist, mv)
			cur = f.objective()
			if cur < best-fmTol(best) {
				best, bestLen = cur, len(hist)
			} else if len(hist)-bestLen >= f.stall {
				break
			}
		}
		// Roll back to the pass's best: each swap undone by swapping the
		// same slots again.
		for i := len(hist) - 1; i >= bestLen; i-- {
			f.apply(hist[i])
		}
		if best >= start-fmTol(start) {
			return
		}
	}
}

// refineNodes runs the gain-cached refinement on se's state within se's
// meter, its scored moves counted in se.tries.
func refineNodes(se *searcher) {
	if se.s.ly.sh.N < 2 {
		return
	}
	newFM(se).run()
}

// overlap is what the tokens that use both e and x (single-copy experts
// on different nodes) add to the sum of their relocations' gains when e
// and x swap nodes: such a token keeps a certain pin on both nodes, while
// each relocation alone counts it as leaving its node when that expert
// was its only certain pin there.
func (f *fmRefiner) overlap(e, x int) float64 {
	s := f.s
	ly, sh := s.ly, s.ly.sh
	N, G, P := f.N, f.G, sh.P
	if f.marked != e {
		f.gen++
		if f.gen == 0 {
			clear(f.stamp)
			f.gen = 1
		}
		f.mark, f.marked = f.gen, e
		for h := 0; h < G; h++ {
			for _, t := range ly.tokensFrom(e, h) {
				f.stamp[t] = f.mark
			}
		}
	}
	A, B := f.ex[e].C, f.ex[x].C
	sum := 0.0
	for h := 0; h < G; h++ {
		H := h / P
		for _, t32 := range ly.tokensFrom(x, h) {
			t := int(t32)
			if f.stamp[t] != f.mark {
				continue
			}
			k := t * N
			c := 0.0
			if A != H && s.z[k+A] == 1 {
				c += s.pr[k+A]
			}
			if B != H && s.z[k+B] == 1 {
				c += s.pr[k+B]
			}
			sum += sh.w[t] * c
		}
	}
	return sum
}
