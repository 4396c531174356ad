package affinity

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
)

// proxy is the node-level placement problem in its clique expansion: a
// token at home A whose experts are S reaches λ − 1 remote nodes, λ being
// the number of distinct nodes of S ∪ {A}; spreading the hyperedge into
// its pairs, each pair weighted 1/k, gives a graph whose cut weight tracks
// λ − 1 and whose moves cost O(1) to score. Vertices are the layer's
// copies (an expert with c copies splits its weights c ways).
type proxy struct {
	N     int
	exp   []int16   // expert of each vertex (copy)
	node  []int     // node of each vertex
	gpu   []int     // GPU of each vertex (kept for the way back)
	w     []float64 // E×E: pair weight of experts
	term  []float64 // E×N: weight of expert e to home node A
	cnt   []int     // copies per expert
	c     []float64 // V×N: Σ of pair weights to the vertices on each node
	load  []float64 // V: tokens of each copy
	nload []float64 // N
	E     int
	cut   float64
	of    [][]int // vertices of each expert
	// cap bounds the busiest node's mean GPU over the mean (tokens per
	// unit of speed, nspeed per node), each token per unit of speed above
	// it charged capSec seconds.
	cap    costmodel.Cap
	capSec float64
	nspeed []float64
	// bud, when set, bounds and charges descend's swaps: changed is the
	// slots that differ from the running plan.
	bud     *budget
	changed int
}

// capExcess is the cap's charge for node loads nl (each node one "GPU"
// of its speed to capExcess).
func (px *proxy) capExcess(nl []float64) float64 {
	return px.capSec * px.cap.Excess(nl, px.nspeed, 1)
}

// newProxy builds the proxy of s's placement.
func newProxy(s *state) *proxy {
	ly, sh := s.ly, s.ly.sh
	E, N, K, P := sh.E, sh.N, sh.K, sh.P
	px := &proxy{N: N, E: E, w: make([]float64, E*E), term: make([]float64, E*N), cnt: make([]int, E), nload: make([]float64, N)}
	inv := 1 / float64(K)
	for t := 0; t < sh.T; t++ {
		ex := ly.ex[t*K : (t+1)*K]
		x := sh.w[t] * inv
		A := int(sh.src[t]) / P
		for i, e := range ex {
			px.term[int(e)*N+A] += x
			row := px.w[int(e)*E:]
			for _, f := range ex[i+1:] {
				row[f] += x
				px.w[int(f)*E+int(e)] += x
			}
		}
	}
	px.of = make([][]int, E)
	for e := range s.cs {
		px.cnt[e] = len(s.cs[e].gpus)
		for i, g := range s.cs[e].gpus {
			px.of[e] = append(px.of[e], len(px.exp))
			px.exp = append(px.exp, int16(e))
			px.gpu = append(px.gpu, int(g))
			px.node = append(px.node, int(g)/P)
			px.load = append(px.load, s.cs[e].cl[i])
		}
	}
	V := len(px.exp)
	px.c = make([]float64, V*N)
	for x := 0; x < V; x++ {
		px.nload[px.node[x]] += px.load[x]
		for y := 0; y < V; y++ {
			if y != x {
				px.c[x*N+px.node[y]] += px.pw(x, y)
			}
		}
	}
	px.cut = px.cost()
	if sh.cap.On() {
		px.cap, px.capSec = sh.cap, sh.capW*sh.perTok
		px.nspeed = make([]float64, N)
		for g, v := range sh.speed {
			px.nspeed[g/P] += v
		}
	}
	return px
}

// pw is the pair weight of vertices x and y (copies split it evenly).
func (px *proxy) pw(x, y int) float64 {
	e, f := int(px.exp[x]), int(px.exp[y])
	if e == f {
		return 0
	}
	return px.w[e*px.E+f] / float64(px.cnt[e]*px.cnt[f])
}

func (px *proxy) tw(x, b int) float64 {
	e := int(px.exp[x])
	return px.term[e*px.N+b] / float64(px.cnt[e])
}

// cost is the cut weight: pairs on different nodes and terminals away
// from their vertex.
func (px *proxy) cost() float64 {
	V, N := len(px.exp), px.N
	c := 0.0
	for x := 0; x < V; x++ {
		for b := 0; b < N; b++ {
			if b != px.node[x] {
				c += px.c[x*N+b] / 2
				c += px.tw(x, b)
			}
		}
	}
	return c
}

// swapDelta is the cut change of swapping the nodes of x and y.
func (px *proxy) swapDelta(x, y int) float64 {
	N := px.N
	a, b := px.node[x], px.node[y]
	d := px.c[x*N+a] - px.c[x*N+b] + px.tw(x, a) - px.tw(x, b)
	d += px.c[y*N+b] - px.c[y*N+a] + px.tw(y, b) - px.tw(y, a)
	return d + 2*px.pw(x, y)
}

// swap exchanges the nodes (and GPUs) of x and y.
func (px *proxy) swap(x, y int) {
	N := px.N
	a, b := px.node[x], px.node[y]
	px.cut += px.swapDelta(x, y)
	for z := range px.exp {
		wx, wy := px.pw(z, x), px.pw(z, y)
		if z != x {
			px.c[z*N+a] -= wx
			px.c[z*N+b] += wx
		}
		if z != y {
			px.c[z*N+b] -= wy
			px.c[z*N+a] += wy
		}
	}
	px.nload[a] += px.load[y] - px.load[x]
	px.nload[b] += px.load[x] - px.load[y]
	px.node[x], px.node[y] = b, a
	px.gpu[x], px.gpu[y] = px.gpu[y], px.gpu[x]
}

// proxyObj is the proxy's objective in seconds: the cut scaled to remote
// copies (scale) at copySec each, plus the busiest node's compute
// (perNodeTok seconds a token) and, with capOn, the cap's charge.
type proxyObj struct {
	scale, perNodeTok, copySec float64
	capOn                      bool
	nl                         []float64 // scratch N
}

func maxNode(nl []float64) float64 {
	mx := 0.0
	for _, v := range nl {
		mx = math.Max(mx, v)
	}
	return mx
}

// delta is the objective's change if x (on node a) and y (on b) swapped,
// the cut's part dcut.

func (o *proxyObj) delta(px *proxy, a, b, x, y int, dcut float64) float64 {
	dl := px.load[y] - px.load[x]
	if !o.capOn {
		// The busiest node before and after, in O(1) from the nodes
		// other than a and b (the same maxima as a scan).
		others := 0.0
		for c, v := range px.nload {
			if c != a && c != b {
				others = math.Max(others, v)
			}
		}
		na, nb := px.nload[a], px.nload[b]
		before := math.Max(others, math.Max(na, nb))
		after := math.Max(others, math.Max(na+dl, nb-dl))
		return dcut*o.scale*2*o.copySec + (after-before)*o.perNodeTok
	}
	nl := o.nl
	copy(nl, px.nload)
	before := maxNode(nl)
	over := -px.capExcess(nl)
	nl[a] += dl
	nl[b] -= dl
	over += px.capExcess(nl)
	return dcut*o.scale*2*o.copySec + (maxNode(nl)-before)*o.perNodeTok + over
}

// allowed reports whether x and y may swap GPUs: copies of one expert
// never share a GPU.
func (px *proxy) allowed(x, y int) bool {
	ex, ey := int(px.exp[x]), int(px.exp[y])
	return ex != ey && !px.holds(px.gpu[y], ex) && !px.holds(px.gpu[x], ey)
}

// descend applies the swap that lowers o the most, over every pair of
// copies on different nodes, until none lowers it by more than tol or
// stop says so; it returns the swaps made. A swap's cut change is the two
// moves' changes, read from the cached pin weights (px.c), plus twice the
// pair's weight (≥ 0); the busiest node after it is at least the other
// nodes' and the pair's mean. So, with every node's copies sorted by
// their move's change, the pairs are walked in order and each walk stops
// where that bound cannot beat the best swap found.
func (px *proxy) descend(o *proxyObj, tol float64, stop func() bool) int {
	V, N := len(px.exp), px.N
	mv := make([]float64, V*N) // mv[x·N+b]: the cut's change if x alone moved to b
	byNode := make([][]int, N)
	k := o.scale * 2 * o.copySec
	n := 0
	for !stop() {
		for b := range byNode {
			byNode[b] = byNode[b][:0]
		}
		for x := 0; x < V; x++ {
			a := px.node[x]
			byNode[a] = append(byNode[a], x)
			for b := 0; b < N; b++ {
				mv[x*N+b] = px.c[x*N+a] - px.c[x*N+b] + px.tw(x, a) - px.tw(x, b)
			}
		}
		before := maxNode(px.nload)
		capBefore := 0.0
		if o.capOn {
			capBefore = px.capExcess(px.nload)
		}
		bd, bx, by := -tol, -1, -1
		for a := 0; a < N; a++ {
			for b := a + 1; b < N; b++ {
				others := 0.0
				for c, v := range px.nload {
					if c != a && c != b {
						others = max(others, v)
					}
				}
				bal := (max(others, (px.nload[a]+px.nload[b])/2)-before)*o.perNodeTok - capBefore
				if px.bud != nil {
					bal -= 2 * px.bud.SlotSec // a swap frees at most two slots
				}
				xs, ys := sortedBy(byNode[a], mv, N, b), sortedBy(byNode[b], mv, N, a)
				for _, x := range xs {
					if len(ys) == 0 || (mv[x*N+b]+mv[ys[0]*N+a])*k+bal >= bd {
						break
					}
					for _, y := range ys {
						dcut := mv[x*N+b] + mv[y*N+a]
						if dcut*k+bal >= bd {
							break
						}
						dcut += 2 * px.pw(x, y)
						d := o.delta(px, a, b, x, y, dcut)
						if px.bud != nil {
							dch := px.swapChanged(x, y)
							if !px.bud.Allows(px.changed + dch) {
								continue
							}
							d += px.bud.Charge(dch)
						}
						if d < bd && px.allowed(x, y) {
							bd, bx, by = d, x, y
						}
					}
				}
			}
		}
		if bx < 0 {
			return n
		}
		if px.bud != nil {
			px.changed += px.swapChanged(bx, by)
		}
		px.swap(bx, by)
		n++
	}
	return n
}

// sortedBy returns xs sorted by mv[x·N+b], ascending (a new slice).
func sortedBy(xs []int, mv []float64, N, b int) []int {
	out := slices.Clone(xs)
	slices.SortFunc(out, func(x, y int) int { return cmp.Compare(mv[x*N+b], mv[y*N+b]) })
	return out
}

// shortSchedule is the share of a full schedule below which the proxy's
// annealing starts from a descent (see anneal). On two layers of the 32k
// DeepSeek-V3 trace (4 × 8 GPUs, 32 slots) the descent with a cooler
// annealing sent 1–2 % fewer remote copies than the plain annealing at
// shares of 0.03–0.06, the same at 0.25, and at 0.42 (plan --effort 1,
// every layer) 0.1 % more, so the switch sits between. On 8 × 8 GPUs with
// 64 slots at 5 s the short path sent 0.7 % fewer remote copies but left
// the busiest GPU higher (1.178 against 1.106) and the layers 0.8 %
// slower (206.5 against 204.8 ms): there the node balance, not the cut,
// is what a short limit should buy first.
const shortSchedule = 1.0 / 8

// anneal runs simulated annealing on swaps of copies between nodes
// until sc ends, scoring the cut (scaled to remote copies by scale, in
// seconds of copySec per copy) plus the busiest node's compute the swap
// shifts (perNodeTok seconds per token on the busiest node). Copies of one
// expert never share a GPU.
//
// A full schedule tries every swap of the neighbourhood annealSweeps
// times. When sc affords only a share r < shortSchedule of that (by its
// work, or by its time at the pace the first deltas took), the annealing
// first descends (descend), then starts at r times the full temperature,
// and descends again at the end: a short schedule started at the full
// temperature would undo the descent and end before it cooled.
func (px *proxy) anneal(rng *rand.Rand, sc *schedule, scale, perNodeTok, copySec float64) (short bool) {
	V, N := len(px.exp), px.N
	if N < 2 || V < 2 {
		return false
	}
	byNode := make([][]int, N)
	pos := make([]int, V)
	index := func() {
		for b := range byNode {
			byNode[b] = byNode[b][:0]
		}
		for x := 0; x < V; x++ {
			pos[x] = len(byNode[px.node[x]])
			byNode[px.node[x]] = append(byNode[px.node[x]], x)
		}
	}
	index()
	o := &proxyObj{scale: scale, perNodeTok: perNodeTok, copySec: copySec, nl: make([]float64, N)}
	pick := func() (a, b, x, y int, ok bool) {
		a = rng.IntN(N)
		b = rng.IntN(N - 1)
		if b >= a {
			b++
		}
		if len(byNode[a]) == 0 || len(byNode[b]) == 0 {
			return 0, 0, 0, 0, false
		}
		x = byNode[a][rng.IntN(len(byNode[a]))]
		y = byNode[b][rng.IntN(len(byNode[b]))]
		return a, b, x, y, px.allowed(x, y)
	}
	// The starting temperature is the mean |Δ| of random swaps, so the
	// schedule scales with the instance (the cap's charge left out).
	t0, n0 := 0.0, 0
	tm := time.Now()
	for i := 0; i < 4*V; i++ {
		if a, b, x, y, ok := pick(); ok {
			t0 += math.Abs(o.delta(px, a, b, x, y, px.swapDelta(x, y)))
			n0++
		}
	}
	perMove := time.Since(tm) / time.Duration(4*V)
	o.capOn = px.cap.On()
	if n0 == 0 || t0 == 0 {
		return false
	}
	t0 /= float64(n0)
	r := px.scheduleShare(sc, perMove)
	short = r < shortSchedule
	if !short {
		r = 1
	}
	if short {
		tol := t0 * coolTo
		px.descend(o, tol, func() bool { return sc.progress() >= 1 || sc.ctx.Err() != nil })
		index()
	}
	for {
		p, ok := sc.next()
		if !ok {
			break
		}
		a, b, x, y, ok := pick()
		if !ok {
			continue
		}
		d := o.delta(px, a, b, x, y, px.swapDelta(x, y))
		if d <= 0 || rng.Float64() < math.Exp(-d/(t0*r*math.Pow(coolTo, p))) {
			px.swap(x, y)
			byNode[a][pos[x]], byNode[b][pos[y]] = y, x
			pos[x], pos[y] = pos[y], pos[x]
		}
	}
	if short {
		px.descend(o, t0*coolTo, func() bool { return sc.ctx.Err() != nil })
	}
	return short
}

// swapChanged is how many more slots differ from the running plan when x
// and y swap GPUs (px.bud's count; negative when the swap undoes moves).
func (px *proxy) swapChanged(x, y int) int {
	return px.bud.SwapChanged(px.gpu[x], int(px.exp[x]), px.gpu[y], int(px.exp[y]))
}

// scheduleShare is the share of a full annealing schedule (every swap of
// the neighbourhood annealSweeps times) that sc affords at perMove a
// move, at most 1.
func (px *proxy) scheduleShare(sc *schedule, perMove time.Duration) float64 {
	V, N := len(px.exp), px.N
	return min(1, sc.affords(perMove)/(annealSweeps*float64(V*V*(N-1))/float64(2*N)))
}

// pace is how long o takes to price a swap, timed over a pass of 4V
// fixed pairs.
func (px *proxy) pace(o *proxyObj) time.Duration {
	V := len(px.exp)
	t0 := time.Now()
	for i := range 4 * V {
		x, y := i%V, (i*7+3)%V
		if a, b := px.node[x], px.node[y]; a != b {
			o.delta(px, a, b, x, y, px.swapDelta(x, y))
		}
	}
	return time.Since(t0) / time.Duration(4*V)
}

// holds reports whether a copy of e sits on GPU g.
func (px *proxy) holds(g, e int) bool {
	for _, x := range px.of[e] {
		if px.gpu[x] == g {
			return true
		}
	}
	return false
}

// copies returns the copies per expert.
func (px *proxy) copies() [][]int32 {
	out := make([][]int32, px.E)
	for x, e := range px.exp {
		out[e] = append(out[e], int32(px.gpu[x]))
	}
	return out
}
