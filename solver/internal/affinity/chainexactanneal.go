package affinity

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/moetuner/moetuner/placement"
)

// gpuCopies returns the copies per layer of expert GPUs gpu.
func gpuCopies(gpu [][]int16) [][][]placement.GPU {
	out := make([][][]placement.GPU, len(gpu))
	for l := range out {
		out[l] = make([][]placement.GPU, len(gpu[l]))
		for e, g := range gpu[l] {
			out[l][e] = []placement.GPU{placement.GPU(g)}
		}
	}
	return out
}

// anneal walks swaps of two experts of one layer on different GPUs, one
// block of consecutive layers per schedule in scs, hot only when it can
// try every swap annealSweeps times (else from a ten-thousandth of the
// mean |Δ|, refining where it starts), never past a layer's compute cap.
// The blocks run in rounds; a block leaves out its last layer unless it
// ends the model, so that no two blocks touch a phase, mask or layer time
// the other reads, and the blocks shift every round so that every layer
// is searched. procs goroutines take the blocks of a round in turn; each
// block has its own random stream and schedule, so the plan depends on
// the blocks, not on how many goroutines ran them. The best plan at the
// end of a round (or the start) is returned (expert GPUs per layer) with
// the swaps scored.
func (cx *chainExact) anneal(seed uint64, scs []*schedule, procs int, canSweep func(rate float64) bool) ([][]int16, int64) {
	L, E := cx.L, cx.E
	W := max(1, min(len(scs), L/3))
	scs = scs[:W]
	procs = max(1, min(procs, W))
	rngs := make([]*rand.Rand, W)
	for w := range rngs {
		rngs[w] = rand.New(rand.NewPCG(seed, uint64(w)))
	}
	scr := make([]*swapScratch, procs)
	for i := range scr {
		scr[i] = cx.newScratch()
	}
	pickEF := func(rng *rand.Rand) (int, int) {
		e := rng.IntN(E)
		f := rng.IntN(E - 1)
		if f >= e {
			f++
		}
		return e, f
	}
	t0, n0 := 0.0, 0
	var tries int64
	t1 := time.Now()
	for range 4 * L {
		l := rngs[0].IntN(L)
		e, f := pickEF(rngs[0])
		tries++
		if cx.gpu[l][e] == cx.gpu[l][f] {
			continue
		}
		if d, _, _, ok := cx.trial(scr[0], l, e, f); ok {
			t0 += math.Abs(d)
			n0++
		}
	}
	if n0 == 0 || t0 == 0 {
		return cx.gpu, tries
	}
	t0 /= float64(n0)
	if !canSweep(float64(procs) * float64(4*L) / max(time.Since(t1).Seconds(), 1e-9)) {
		t0 *= coolTo
	}
	// worker runs block w's up to E swaps per layer of [lo, hi) on
	// goroutine i's scratch and reports whether w's schedule has ended.
	// The layer changes every E picks: a run of swaps in one layer reads
	// its tokens' arrays while they are in cache (3× faster on 58 layers
	// of 32,768 tokens).
	cand := make([][]int, procs)
	worker := func(w, i, lo, hi int, n *int64) bool {
		rng, s := rngs[w], scr[i]
		return scs[w].runLayers(rng, lo, hi, E, func(l int, p float64) {
			*n++
			e, f := pickEF(rng)
			if rng.IntN(2) == 0 {
				if x, ok := cx.critical(l, rng, &cand[i]); ok {
					e = x
					if f == e {
						return
					}
				}
			}
			if cx.gpu[l][e] == cx.gpu[l][f] {
				return
			}
			b, e, f, dc, ok := cx.budgeted(rng, l, e, f)
			if !ok {
				return
			}
			d, tl, tn, ok := cx.trial(s, l, e, f)
			if b != nil {
				d += b.SlotSec * float64(dc)
			}
			if ok && (d <= 0 || rng.Float64() < math.Exp(-d/(t0*math.Pow(coolTo, p)))) {
				cx.apply(s, l, e, f, tl, tn)
				if b != nil {
					b.changed += dc
				}
			}
		})
	}
	best := cx.cost()
	bestGPU := cloneGPU(cx.gpu)
	done := make([]bool, W)
	counts := make([]int64, W)
	for r := 0; ; r++ {
		blockRound(L, W, procs, r, 1, done, func(w, i, lo, hi int) bool { return worker(w, i, lo, hi, &counts[w]) })
		if c := cx.cost(); c < best*(1-1e-12) {
			best = c
			for l := range bestGPU {
				copy(bestGPU[l], cx.gpu[l])
			}
		}
		if !slices.Contains(done, false) {
			break
		}
	}
	for _, n := range counts {
		tries += n
	}
	return bestGPU, tries
}

// budgeted is the move budget's say on a swap of experts e and f in
// layer l: the layer's budget (nil: none), the swap it becomes, the slots
// it changes and whether it may be tried. Under a nearly spent budget
// half the swaps take a moved expert, and half of those a moved partner
// (a swap of two moved experts never adds to the count).
func (cx *chainExact) budgeted(rng *rand.Rand, l, e, f int) (b *chainBudget, e2, f2, dc int, ok bool) {
	if cx.bud == nil {
		return nil, e, f, 0, true
	}
	b = cx.bud[l]
	if b.Max > 0 && b.changed >= b.Max-1 && rng.IntN(2) == 0 {
		if x, ok := cx.movedExpert(l, b, rng); ok {
			e = x
			if rng.IntN(2) == 0 {
				if y, ok := cx.movedExpert(l, b, rng); ok {
					f = y
				}
			}
		}
		if e == f || cx.gpu[l][e] == cx.gpu[l][f] {
			return b, e, f, 0, false
		}
	}
	dc = b.SwapChanged(int(cx.gpu[l][e]), e, int(cx.gpu[l][f]), f)
	if b.Max > 0 && b.changed+dc > b.Max {
		return b, e, f, dc, false
	}
	return b, e, f, dc, true
}

// ports is phase ph's busiest NIC port with the changes s.d…[d] (d −1:
// none): its copies, its GPU and whether it is the GPU's out port.
// Copies from tokens with no home reach a node's GPUs from the G − P
// GPUs of the other nodes, 1/G of a copy from each.
func (cx *chainExact) ports(ph int, s *swapScratch, d int) (float64, int, bool) {
	G, P, N := cx.G, cx.P, cx.N
	out, in, un := cx.out[ph], cx.in[ph], cx.un[ph]
	var dOut, dIn, dUn []float64
	if d >= 0 {
		dOut, dIn, dUn = s.dOut[d], s.dIn[d], s.dUn[d]
	}
	U := 0.0
	for b, v := range un {
		if dUn != nil {
			v += dUn[b]
		}
		U += v
	}
	inv := 1 / float64(G)
	top, at, isOut := -1.0, 0, false
	for g := 0; g < G; g++ {
		b := g / P
		ub := un[b]
		o, i := out[g], in[g]
		if dOut != nil {
			ub += dUn[b]
			o += dOut[g]
			i += dIn[g]
		}
		if o += (U - ub) * inv; o > top {
			top, at, isOut = o, g, true
		}
		if i += float64(N-1) * ub * inv; i > top {
			top, at, isOut = i, g, false
		}
	}
	return top, at, isOut
}

// critical draws an expert of layer l whose move can relieve the busiest
// NIC port of the phases a swap in l touches (the busier of the two):
// into layer l, one on the node the busiest in port serves (or, for an
// out port, one its tokens reach on another node); out of layer l, one
// on the busiest sender, or one on a sender with the busiest in port's
// local index on another node. False when no expert qualifies.
func (cx *chainExact) critical(l int, rng *rand.Rand, buf *[]int) (int, bool) {
	P := cx.P
	v, g, isOut := cx.ports(l, nil, -1)
	next := false
	if l+1 < cx.L {
		if v1, g1, o1 := cx.ports(l+1, nil, -1); v1 >= v {
			g, isOut, next = g1, o1, true
		}
	}
	c := (*buf)[:0]
	for e, h := range cx.gpu[l] {
		h := int(h)
		var ok bool
		switch {
		case next && isOut:
			ok = h == g
		case next:
			ok = h%P == g%P && h/P != g/P
		case isOut:
			ok = h/P != g/P
		default:
			ok = h/P == g/P
		}
		if ok {
			c = append(c, e)
		}
	}
	*buf = c
	if len(c) == 0 {
		return 0, false
	}
	return c[rng.IntN(len(c))], true
}

func cloneGPU(g [][]int16) [][]int16 {
	out := make([][]int16, len(g))
	for l := range g {
		out[l] = append([]int16(nil), g[l]...)
	}
	return out
}
