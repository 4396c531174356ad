package affinity

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// anneal is proxy.anneal for the chain: swaps of copies between GPUs
// within a layer, scored by the cut (scale copies per unit, copySec each),
// the layer's busiest GPU (perTok per token over the GPU's speed) and,
// where pricePorts priced them, its busiest sender port above the mean
// (the cut prices the ports as if they were even, and the busiest one
// sets the all-to-all's time).
// Swaps within a node change only the senders' part of the cut and move
// load between its GPUs: the busiest GPU, not the busiest node, sets the
// compute tail, and with few slots per GPU a node's experts can be
// balanced over the nodes and still not pack evenly over its GPUs.
//
// A swap in layer l reads layer l's arrays and writes layers l−1 to l+1,
// so layers three apart can be searched at once: the layers are cut into
// len(scs) blocks of consecutive layers, each with its own schedule and
// random stream, and a round runs every block but its last two layers
// (the next block's first writes there) on procs goroutines; the cuts
// shift by one layer each round, so every layer is searched in all but
// two rounds of a block's width. The plan depends on the blocks, not on
// how many goroutines ran them. Between rounds, the nodes are relabelled
// relabels times at even steps of the slowest block's progress. It
// returns the moves made.
func (cp *chainProxy) anneal(seed uint64, scs []*schedule, procs int, scale, perTok, copySec float64, kind []int, relabels int) int64 {
	L, N, P := cp.L, cp.N, cp.P
	if N < 2 {
		return 0
	}
	W := len(scs)
	byNode := make([][][]int, L)
	pos := make([][]int, L)
	index := func() {
		for l := range byNode {
			byNode[l] = make([][]int, N)
			pos[l] = make([]int, len(cp.exp[l]))
			for x, b := range cp.node[l] {
				pos[l][x] = len(byNode[l][b])
				byNode[l][b] = append(byNode[l][b], x)
			}
		}
	}
	index()
	mark := 1
	delta := func(l, x, y int) float64 { return cp.annealDelta(l, x, y, scale, perTok, copySec) }
	// One move in P stays within a node (P−1 GPUs of the N·P−1 others
	// would be fewer when nodes are many).
	pick := func(rng *rand.Rand, l int) (a, b, x, y int, ok bool) {
		a = rng.IntN(N)
		b = a
		if P < 2 || rng.IntN(P) != 0 {
			b = rng.IntN(N - 1)
			if b >= a {
				b++
			}
		}
		if len(byNode[l][a]) == 0 || len(byNode[l][b]) == 0 {
			return
		}
		x = byNode[l][a][rng.IntN(len(byNode[l][a]))]
		y = byNode[l][b][rng.IntN(len(byNode[l][b]))]
		ex, ey := int(cp.exp[l][x]), int(cp.exp[l][y])
		ok = ex != ey && cp.gpu[l][x] != cp.gpu[l][y] && !cp.holds(l, cp.gpu[l][y], ex) && !cp.holds(l, cp.gpu[l][x], ey)
		return
	}
	rngs := make([]*rand.Rand, W)
	for w := range rngs {
		rngs[w] = rand.New(rand.NewPCG(seed, uint64(w)))
	}
	t0, n0 := 0.0, 0
	for i := 0; i < 64*L; i++ {
		l := rngs[0].IntN(L)
		if _, _, x, y, ok := pick(rngs[0], l); ok {
			t0 += math.Abs(delta(l, x, y))
			n0++
		}
	}
	if n0 == 0 || t0 == 0 {
		return 0
	}
	t0 /= float64(n0)
	// worker runs block w's layers [lo, hi), a run of E picks in a layer
	// at a time (its arrays stay in cache), and reports whether w's
	// schedule has ended.
	run := max(1, cp.E)
	worker := func(w, _, lo, hi int) bool {
		rng := rngs[w]
		return scs[w].runLayers(rng, lo, hi, run, func(l int, p float64) {
			a, b, x, y, ok := pick(rng, l)
			if !ok {
				return
			}
			d := delta(l, x, y)
			if d <= 0 || rng.Float64() < math.Exp(-d/(t0*math.Pow(coolTo, p))) {
				cp.swap(l, x, y)
				byNode[l][a][pos[l][x]], byNode[l][b][pos[l][y]] = y, x
				pos[l][x], pos[l][y] = pos[l][y], pos[l][x]
			}
		})
	}
	done := make([]bool, W)
	for r := 0; ; r++ {
		blockRound(L, W, procs, r, 2, done, worker)
		if !slices.Contains(done, false) {
			break
		}
		prog := 1.0
		for w, sc := range scs {
			if !done[w] {
				prog = min(prog, sc.progress())
			}
		}
		if relabels > 0 && mark <= relabels && prog*float64(relabels+1) >= float64(mark) {
			mark++
			if cp.relabel(kind) > 0 {
				index()
			}
		}
	}
	var n int64
	for _, sc := range scs {
		n += sc.done
	}
	return n
}

// annealDelta is what swapping copies x and y of layer l changes in the
// annealing's cost: the cut (scale copies per unit, copySec each), the
// ports' excess where they are priced, and the busiest GPU's tokens
// (perTok seconds each).
func (cp *chainProxy) annealDelta(l, x, y int, scale, perTok, copySec float64) float64 {
	gl := cp.gload[l]
	gx, gy := cp.gpu[l][x], cp.gpu[l][y]
	d := cp.load[l][y] - cp.load[l][x]
	before, after := 0.0, 0.0
	for g, v := range gl {
		before = max(before, v)
		switch g {
		case gx:
			v += d / cp.speed[gx]
		case gy:
			v -= d / cp.speed[gy]
		}
		after = max(after, v)
	}
	cut := cp.swapDelta(l, x, y) * scale * copySec
	if cp.portSec != nil && cp.portSec[l] > 0 {
		cut += cp.portExcess(l, x, y) * cp.portSec[l]
	}
	return cut + (after-before)*perTok
}

// peak is layer l's busiest GPU load (tokens over speed).
func (cp *chainProxy) peak(l int) float64 {
	return slices.Max(cp.gload[l])
}

// capPeak lowers layer l's busiest GPU to at most limit, each step taking
// the swap of a copy on the busiest GPU with a lighter one elsewhere that
// lowers the busiest GPU at the least increase of the cut (scale copies
// per unit, copySec each; within a node only the senders' part), until the
// peak is within limit, no swap lowers it or the deadline (if not zero)
// passes. It returns the swaps made and whether the peak is within limit.
func (cp *chainProxy) capPeak(l int, limit, scale, copySec float64, deadline time.Time) (int, bool) {
	gl := cp.gload[l]
	V := len(cp.exp[l])
	n := 0
	for iter := 0; iter < V*len(gl); iter++ {
		top := 0
		for g, v := range gl {
			if v > gl[top] {
				top = g
			}
		}
		if gl[top] <= limit*(1+1e-12) {
			return n, true
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return n, false
		}
		bx, by, bc := -1, -1, math.Inf(1)
		for x := 0; x < V; x++ {
			if cp.gpu[l][x] != top {
				continue
			}
			ex := int(cp.exp[l][x])
			for y := 0; y < V; y++ {
				h := cp.gpu[l][y]
				d := cp.load[l][x] - cp.load[l][y]
				if h == top || d <= 0 {
					continue
				}
				ey := int(cp.exp[l][y])
				if ex == ey || gl[h]+d/cp.speed[h] >= gl[top]*(1-1e-12) || cp.holds(l, h, ex) || cp.holds(l, top, ey) {
					continue
				}
				if c := cp.swapDelta(l, x, y) * scale * copySec; c < bc {
					bx, by, bc = x, y, c
				}
			}
		}
		if bx < 0 {
			break
		}
		cp.swap(l, bx, by)
		n++
	}
	return n, cp.peak(l) <= limit*(1+1e-12)
}

// copies returns layer l's copies per expert.
func (cp *chainProxy) copies(l int) [][]int32 {
	out := make([][]int32, cp.E)
	for x, e := range cp.exp[l] {
		out[e] = append(out[e], int32(cp.gpu[l][x]))
	}
	return out
}
