package affinity

import (
	"math/bits"
	"math/rand/v2"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// chainExact is the chain flow's NIC traffic counted token by token, the
// way the cost model counts it, for plans with one copy of every expert
// on at most 64 GPUs: a token's partial results leave each GPU of its
// layer-(l−1) experts once for every other node its layer-l experts reach,
// one NIC copy from the sender to the GPU with its local index there; the
// first layer's dispatch and the last layer's combine go between the
// token's home and its experts' nodes. Each token keeps the mask of its
// experts' GPUs per layer, so a swap of two experts is scored in the
// tokens of the two experts, with every NIC port's bytes, the layers'
// compute tails and the layer time exact (NVLink is left out: the NIC's
// copies set the all-to-all wherever the search runs, several nodes).
type chainExact struct {
	L, E, K, N, P, G int
	// gpu[l][e] is expert e's GPU in layer l.
	gpu [][]int16
	// mask[l][t] is the GPUs of token t's layer-l experts, a bit each.
	mask [][]uint64
	// toks[l][off[l][e]:off[l][e+1]] are the tokens using e in layer l.
	toks [][]int32
	off  [][]int32
	// ex[l][t·K:(t+1)·K] are token t's layer-l experts (layer by layer,
	// so that a swap's tokens are read from one layer's array).
	ex   [][]int16
	cnt  []float64 // [t]
	home []int16   // [t]: source GPU, −1 none (homes spread evenly)
	// Phase l < L is the dispatch into layer l (from the homes for l = 0),
	// phase L the last layer's combine (its ports are the home dispatch's
	// transposed, so they are counted as one).
	out, in [][]float64 // [phase][g]: NIC copies out of and into g
	un      [][]float64 // [phase][B]: copies to node B from tokens with no home
	gtok    [][]float64 // [l][g]: tokens
	slots   []float64
	speed   []float64
	tcap    []float64 // [l]: compute tail cap, seconds
	ltime   []float64 // [l]: the layer's modeled time, seconds
	// lcap[l], when set, lets a swap that sends fewer NIC copies raise
	// layer l's time up to it (the gain-cached refinement, chainfm.go).
	lcap []float64
	cut  []float64 // [phase]: NIC copies

	// nodeMask[b] is node b's GPUs, a bit each.
	nodeMask []uint64

	terms        costmodel.Terms
	copySec, lat float64
	// tie prices a NIC copy anywhere at 1/(2G) of one on the busiest
	// port (its chance of landing there among the 2G ports): the busiest
	// port sets the time, the others break its ties.
	tie float64
	// bud[l], with a running plan, bounds and prices layer l's changed
	// slots (nil: free moves).
	bud []*chainBudget
}

// chainBudget is one layer's move budget against the running plan
// (Problem.Current), as budget is the home flow's, with its count.
type chainBudget struct {
	budget
	changed int
}

// newChainBudgets returns every layer's budget against p.Current (nil
// without one) with the changed slots of copies counted.
func newChainBudgets(p Problem, copies [][][]placement.GPU) []*chainBudget {
	if !p.budgeted() {
		return nil
	}
	out := make([]*chainBudget, p.Stats.Layers)
	for l := range out {
		b := &chainBudget{budget: *newBudget(p, l)}
		for e, gs := range copies[l] {
			for _, g := range gs {
				b.changed += b.Off(int(g), e)
			}
		}
		out[l] = b
	}
	return out
}

// movedExpert returns, uniformly at random, an expert of layer l that is
// not on its running plan's GPU (false when none).
func (cx *chainExact) movedExpert(l int, b *chainBudget, rng *rand.Rand) (int, bool) {
	if b.changed == 0 {
		return 0, false
	}
	n := rng.IntN(b.changed)
	for e, g := range cx.gpu[l] {
		if b.Off(int(g), e) == 1 {
			if n == 0 {
				return e, true
			}
			n--
		}
	}
	return 0, false
}

// swapScratch is a trial swap's changes: the NIC ports', homeless
// masses' and copies' of the two phases it touches, and the tokens whose
// GPUs change with their new masks.
type swapScratch struct {
	dOut, dIn, dUn [2][]float64
	dCut           [2]float64
	chT            []int32
	chM            []uint64
}

func (cx *chainExact) newScratch() *swapScratch {
	s := &swapScratch{}
	for i := range s.dOut {
		s.dOut[i], s.dIn[i], s.dUn[i] = make([]float64, cx.G), make([]float64, cx.G), make([]float64, cx.N)
	}
	return s
}

// newChainExact returns the exact counters of copies (one GPU per expert
// per layer) under p, or nil where they do not apply: replicas, more
// than 64 GPUs, fewer than two layers or nodes, or no per-token paths.
// tcap[l] is layer l's compute tail cap in seconds.
func newChainExact(p Problem, copies [][][]placement.GPU, tcap []float64) *chainExact {
	st, c := p.Stats, p.Cluster
	G, N, P := c.GPUs(), c.Nodes, c.GPUsPerNode
	L, E, K := st.Layers, st.Experts, st.TopK
	if G > 64 || N < 2 || L < 2 || st.Patterns == nil || K < 1 || len(copies) != L {
		return nil
	}
	for l := range copies {
		if len(copies[l]) != E {
			return nil
		}
		for _, gs := range copies[l] {
			if len(gs) != 1 {
				return nil
			}
		}
	}
	T := len(st.Patterns)
	cx := &chainExact{L: L, E: E, K: K, N: N, P: P, G: G,
		gpu: make([][]int16, L), mask: make([][]uint64, L), toks: make([][]int32, L), off: make([][]int32, L),
		ex: make([][]int16, L), cnt: make([]float64, T), home: make([]int16, T),
		out: make([][]float64, L+1), in: make([][]float64, L+1), un: make([][]float64, L+1),
		gtok: make([][]float64, L), slots: make([]float64, G), speed: make([]float64, G),
		tcap: tcap, ltime: make([]float64, L), cut: make([]float64, L+1),
		copySec: p.Model.TokenBytes() / c.NICBytesPerSec(), lat: c.NICLatency.Seconds(),
		terms: p.Scenario.Terms()}
	cx.tie = 1 / float64(2*G)
	cx.nodeMask = make([]uint64, N)
	for b := range cx.nodeMask {
		cx.nodeMask[b] = (uint64(1)<<uint(P) - 1) << uint(b*P)
	}
	for g := range cx.speed {
		cx.speed[g] = c.SpeedOf(g)
		if g < len(p.Slots) {
			cx.slots[g] = float64(p.Slots[g])
		}
	}
	for l := range cx.ex {
		cx.ex[l] = make([]int16, 0, T*K)
	}
	for i, pt := range st.Patterns {
		for l := range cx.ex {
			cx.ex[l] = append(cx.ex[l], pt.Experts[l*K:(l+1)*K]...)
		}
		cx.cnt[i], cx.home[i] = pt.Count, -1
		if pt.Source >= 0 && int(pt.Source) < G {
			cx.home[i] = int16(pt.Source)
		}
	}
	for l := 0; l < L; l++ {
		cx.gpu[l] = make([]int16, E)
		for e, gs := range copies[l] {
			cx.gpu[l][e] = int16(gs[0])
		}
		cx.mask[l] = make([]uint64, T)
		cx.gtok[l] = make([]float64, G)
		off := make([]int32, E+1)
		for t := range T {
			var m uint64
			for _, e := range cx.ex[l][t*K : (t+1)*K] {
				g := cx.gpu[l][e]
				m |= 1 << uint(g)
				off[e+1]++
				cx.gtok[l][g] += cx.cnt[t]
			}
			cx.mask[l][t] = m
		}
		for e := 0; e < E; e++ {
			off[e+1] += off[e]
		}
		toks := make([]int32, off[E])
		fill := append([]int32(nil), off[:E]...)
		for t := range T {
			for _, e := range cx.ex[l][t*K : (t+1)*K] {
				toks[fill[e]] = int32(t)
				fill[e]++
			}
		}
		cx.toks[l], cx.off[l] = toks, off
	}
	for ph := 0; ph <= L; ph++ {
		cx.out[ph], cx.in[ph], cx.un[ph] = make([]float64, G), make([]float64, G), make([]float64, N)
		for t := range T {
			cx.cut[ph] += cx.contrib(t, cx.sendersOf(ph, t), cx.reachOf(ph, t), 1, cx.out[ph], cx.in[ph], cx.un[ph])
		}
	}
	for l := range cx.ltime {
		cx.ltime[l] = cx.layerTime(l, cx.tail(l, -1, -1, 0), cx.portSec(l, nil, -1), cx.portSec(l+1, nil, -1))
	}
	return cx
}

// nodes returns the nodes of the GPUs in m, a bit each, without a branch
// per node: (v | −v) >> 63 is 1 exactly when v ≠ 0.
func (cx *chainExact) nodes(m uint64) uint64 {
	var r uint64
	for b, nm := range cx.nodeMask {
		v := m & nm
		r |= ((v | -v) >> 63) << uint(b)
	}
	return r
}

// sendersOf is phase ph's senders of token t: its layer-(ph−1) GPUs, or 0
// when the phase starts at its home.
func (cx *chainExact) sendersOf(ph, t int) uint64 {
	if ph == 0 || ph == cx.L {
		return 0
	}
	return cx.mask[ph-1][t]
}

// reachOf is the nodes phase ph takes token t to.
func (cx *chainExact) reachOf(ph, t int) uint64 {
	if ph == cx.L {
		return cx.nodes(cx.mask[cx.L-1][t])
	}
	return cx.nodes(cx.mask[ph][t])
}

// contrib adds sign × token t's NIC copies in a phase, from senders (its
// home when 0) to the nodes in reach, to the ports out and in and the
// homeless node masses un, and returns them.
func (cx *chainExact) contrib(t int, senders, reach uint64, sign float64, out, in, un []float64) float64 {
	c := sign * cx.cnt[t]
	if senders == 0 {
		h := int(cx.home[t])
		if h < 0 {
			// Homes spread evenly: each of a node's GPUs receives from
			// the G − P GPUs of the other nodes, 1/G of the token each.
			n := float64(bits.OnesCount64(reach))
			for r := reach; r != 0; r &= r - 1 {
				un[bits.TrailingZeros64(r)] += c
			}
			return c * n * float64(cx.N-1) / float64(cx.N)
		}
		senders = 1 << uint(h)
	}
	P := cx.P
	total := 0.0
	for s := senders; s != 0; s &= s - 1 {
		g := bits.TrailingZeros64(s)
		r := reach &^ (1 << uint(g/P))
		n := bits.OnesCount64(r)
		if n == 0 {
			continue
		}
		out[g] += c * float64(n)
		i := g % P
		for ; r != 0; r &= r - 1 {
			in[bits.TrailingZeros64(r)*P+i] += c
		}
		total += c * float64(n)
	}
	return total
}

// reachChange adds token t's change of NIC copies in a phase from
// senders (none: its home) when the nodes it reaches go from rOld to
// rNew, to the ports out and in and the homeless masses un, and returns
// it: what contrib(…, rNew, 1) − contrib(…, rOld, −1) adds, in the
// changed nodes only.
func (cx *chainExact) reachChange(t int, senders, rOld, rNew uint64, out, in, un []float64) float64 {
	c := cx.cnt[t]
	diff := rOld ^ rNew
	if senders == 0 {
		h := int(cx.home[t])
		if h < 0 {
			for r := diff; r != 0; r &= r - 1 {
				b := bits.TrailingZeros64(r)
				if rNew&(1<<uint(b)) != 0 {
					un[b] += c
				} else {
					un[b] -= c
				}
			}
			n := bits.OnesCount64(rNew) - bits.OnesCount64(rOld)
			return c * float64(n) * float64(cx.N-1) / float64(cx.N)
		}
		senders = 1 << uint(h)
	}
	P := cx.P
	total := 0.0
	for s := senders; s != 0; s &= s - 1 {
		g := bits.TrailingZeros64(s)
		own := uint64(1) << uint(g/P)
		d := diff &^ own
		if d == 0 {
			continue
		}
		i := g % P
		n := 0
		for r := d; r != 0; r &= r - 1 {
			b := bits.TrailingZeros64(r)
			if rNew&(1<<uint(b)) != 0 {
				in[b*P+i] += c
				n++
			} else {
				in[b*P+i] -= c
				n--
			}
		}
		out[g] += c * float64(n)
		total += c * float64(n)
	}
	return total
}

// portSec is phase ph's all-to-all time, with the changes s.d…[d]
// (d −1: none): its busiest NIC port over the NIC, plus its latency
// when any copy crosses; 0 for a phase that does not exist.
func (cx *chainExact) portSec(ph int, s *swapScratch, d int) float64 {
	if ph > cx.L {
		return 0
	}
	busiest, _, _ := cx.ports(ph, s, d)
	cut := cx.cut[ph]
	if d >= 0 {
		cut += s.dCut[d]
	}
	if cut <= 1e-9 {
		return 0
	}
	return busiest*cx.copySec + cx.lat
}

// tail is layer l's compute tail with dx tokens moved from GPU a to b.
func (cx *chainExact) tail(l, a, b int, dx float64) float64 {
	t := 0.0
	for g, x := range cx.gtok[l] {
		switch g {
		case a:
			x -= dx
		case b:
			x += dx
		}
		t = max(t, cx.terms.Compute(g, x, cx.slots[g]))
	}
	return t
}

// layerTime is layer l's modeled time from its compute tail and the
// seconds of its dispatch and (the last layer only) combine.
func (cx *chainExact) layerTime(l int, tail, disp, comb float64) float64 {
	comm := disp
	if l == cx.L-1 {
		comm += comb
	}
	return cx.terms.LayerSec(tail, comm, 0)
}

// cost is the objective: the layers' times plus the tie-break price of
// every NIC copy.
func (cx *chainExact) cost() float64 {
	s := 0.0
	for _, v := range cx.ltime {
		s += v
	}
	for _, v := range cx.cut {
		s += v * cx.copySec * cx.tie
	}
	for _, b := range cx.bud {
		if b != nil {
			s += b.SlotSec * float64(b.changed)
		}
	}
	return s
}

// moved is the tokens that swapping e and f of layer l moves from e's GPU
// to f's (e's less f's).
func (cx *chainExact) moved(l, e, f int) float64 {
	dx := 0.0
	for _, t := range cx.toks[l][cx.off[l][e]:cx.off[l][e+1]] {
		dx += cx.cnt[t]
	}
	for _, t := range cx.toks[l][cx.off[l][f]:cx.off[l][f+1]] {
		dx -= cx.cnt[t]
	}
	return dx
}

// trial scores the swap of experts e and f of layer l (on different
// GPUs): it fills the scratch with the port changes of phases l and l+1,
// the changed tokens and their new masks, and returns the change of the
// cost, the new times of layers l and l+1 and whether layer l stays
// within its compute cap.
func (cx *chainExact) trial(s *swapScratch, l, e, f int) (delta, tl, tn float64, ok bool) {
	L := cx.L
	a, b := int(cx.gpu[l][e]), int(cx.gpu[l][f])
	dx := cx.moved(l, e, f)
	// e's tokens move from a to b, f's from b to a.
	ntail := cx.tail(l, a, b, dx)
	if ntail > cx.tcap[l] {
		return 0, 0, 0, false
	}
	for i := range s.dOut {
		clear(s.dOut[i])
		clear(s.dIn[i])
		clear(s.dUn[i])
		s.dCut[i] = 0
	}
	s.chT, s.chM = s.chT[:0], s.chM[:0]
	for _, t := range cx.toks[l][cx.off[l][e]:cx.off[l][e+1]] {
		cx.visit(s, l, int(t), e, f, b)
	}
	for _, t := range cx.toks[l][cx.off[l][f]:cx.off[l][f+1]] {
		cx.visit(s, l, int(t), f, e, a)
	}
	disp := cx.portSec(l, s, 0)
	if l == L-1 {
		tl = cx.layerTime(l, ntail, disp, cx.portSec(L, s, 1))
		delta = tl - cx.ltime[l]
	} else {
		tl = cx.layerTime(l, ntail, disp, 0)
		comb := 0.0
		if l+2 == L {
			comb = cx.portSec(L, s, -1)
		}
		tn = cx.layerTime(l+1, cx.tail(l+1, -1, -1, 0), cx.portSec(l+1, s, 1), comb)
		delta = tl - cx.ltime[l] + tn - cx.ltime[l+1]
	}
	delta += (s.dCut[0] + s.dCut[1]) * cx.copySec * cx.tie
	return delta, tl, tn, true
}

// visit adds to s what the swap of experts mine and other in layer l
// changes for token t, one of mine's tokens: mine moves to GPU to (a
// token that uses other too keeps its GPUs). It records the token's new
// mask and the change of NIC copies in the phases into layers l and l+1.
func (cx *chainExact) visit(s *swapScratch, l, t, mine, other, to int) {
	K, L := cx.K, cx.L
	gl := cx.gpu[l]
	var m uint64
	for _, x := range cx.ex[l][t*K : (t+1)*K] {
		if int(x) == other {
			return // the token uses both: its GPUs stay
		}
		g := int(gl[x])
		if int(x) == mine {
			g = to
		}
		m |= 1 << uint(g)
	}
	old := cx.mask[l][t]
	if m == old {
		return
	}
	s.chT, s.chM = append(s.chT, int32(t)), append(s.chM, m)
	rOld, rNew := cx.nodes(old), cx.nodes(m)
	if rOld != rNew {
		s.dCut[0] += cx.reachChange(t, cx.sendersOf(l, t), rOld, rNew, s.dOut[0], s.dIn[0], s.dUn[0])
		if l == L-1 {
			s.dCut[1] += cx.reachChange(t, 0, rOld, rNew, s.dOut[1], s.dIn[1], s.dUn[1])
		}
	}
	if l < L-1 {
		// Only the senders that changed change the next phase.
		// (contrib reads no senders as the home).
		r := cx.nodes(cx.mask[l+1][t])
		if gone := old &^ m; gone != 0 {
			s.dCut[1] += cx.contrib(t, gone, r, -1, s.dOut[1], s.dIn[1], s.dUn[1])
		}
		if came := m &^ old; came != 0 {
			s.dCut[1] += cx.contrib(t, came, r, 1, s.dOut[1], s.dIn[1], s.dUn[1])
		}
	}
}

// apply makes the swap that trial scored into s.
func (cx *chainExact) apply(s *swapScratch, l, e, f int, tl, tn float64) {
	L := cx.L
	a, b := int(cx.gpu[l][e]), int(cx.gpu[l][f])
	dx := cx.moved(l, e, f)
	cx.gtok[l][a] -= dx
	cx.gtok[l][b] += dx
	cx.gpu[l][e], cx.gpu[l][f] = int16(b), int16(a)
	for i, t := range s.chT {
		cx.mask[l][t] = s.chM[i]
	}
	phs := [2]int{l, l + 1}
	for i, ph := range phs {
		if ph > L {
			continue
		}
		for g := range cx.out[ph] {
			cx.out[ph][g] += s.dOut[i][g]
			cx.in[ph][g] += s.dIn[i][g]
		}
		for b := range cx.un[ph] {
			cx.un[ph][b] += s.dUn[i][b]
		}
		cx.cut[ph] += s.dCut[i]
	}
	cx.ltime[l] = tl
	if l+1 < L {
		cx.ltime[l+1] = tn
	}
}
