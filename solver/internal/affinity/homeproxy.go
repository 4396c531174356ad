package affinity

import (
	"math"
	"math/rand/v2"

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

// anneal runs simulated annealing on swaps of copies between nodes
// until sc ends, scoring the cut (scaled to remote copies by scale, in
// seconds of copySec per copy) plus the busiest node's compute the swap
// shifts (perNodeTok seconds per token on the busiest node). Copies of one
// expert never share a GPU.
func (px *proxy) anneal(rng *rand.Rand, sc *schedule, scale, perNodeTok, copySec float64) {
	V, N := len(px.exp), px.N
	if N < 2 || V < 2 {
		return
	}
	maxNode := func(nl []float64) float64 {
		mx := 0.0
		for _, v := range nl {
			mx = math.Max(mx, v)
		}
		return mx
	}
	byNode := make([][]int, N)
	for x := 0; x < V; x++ {
		byNode[px.node[x]] = append(byNode[px.node[x]], x)
	}
	pos := make([]int, V)
	for b := range byNode {
		for i, x := range byNode[b] {
			pos[x] = i
		}
	}
	obj := func(dcut, dmax float64) float64 { return dcut*scale*2*copySec + dmax*perNodeTok }
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
		ex, ey := int(px.exp[x]), int(px.exp[y])
		return a, b, x, y, ex != ey && !px.holds(px.gpu[y], ex) && !px.holds(px.gpu[x], ey)
	}
	nl := make([]float64, N)
	capOn := false
	delta := func(a, b, x, y int) float64 {
		copy(nl, px.nload)
		before := maxNode(nl)
		var over float64
		if capOn {
			over = -px.capExcess(nl)
		}
		nl[a] += px.load[y] - px.load[x]
		nl[b] += px.load[x] - px.load[y]
		if capOn {
			over += px.capExcess(nl)
		}
		return obj(px.swapDelta(x, y), maxNode(nl)-before) + over
	}
	// The starting temperature is the mean |Δ| of random swaps, so the
	// schedule scales with the instance (the cap's charge left out).
	t0, n0 := 0.0, 0
	for i := 0; i < 4*V; i++ {
		if a, b, x, y, ok := pick(); ok {
			t0 += math.Abs(delta(a, b, x, y))
			n0++
		}
	}
	capOn = px.cap.On()
	if n0 == 0 || t0 == 0 {
		return
	}
	t0 /= float64(n0)
	for {
		p, ok := sc.next()
		if !ok {
			return
		}
		a, b, x, y, ok := pick()
		if !ok {
			continue
		}
		d := delta(a, b, x, y)
		if d <= 0 || rng.Float64() < math.Exp(-d/(t0*math.Pow(coolTo, p))) {
			px.swap(x, y)
			byNode[a][pos[x]], byNode[b][pos[y]] = y, x
			pos[x], pos[y] = pos[y], pos[x]
		}
	}
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
