package affinity

import (
	"errors"
	"math"
	"slices"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
)

// chainProxy is the chain flow's placement problem in its clique
// expansion over adjacent layers: a token's partial results move from the
// GPUs of its layer-(l−1) experts to the nodes of its layer-l experts, so
// every pair (e at l−1, f at l) the token uses is an edge, weighted 1/k
// per token; a token reaches a node once however many of its layer-l
// experts the node holds, so the pairs within a layer are edges too
// (weighted intraWeight/k); a token's partial results leave each GPU of
// its layer-l experts once, so below the last layer its pairs within a
// layer weigh again when they sit on different GPUs (sendWeight/k, the
// same node or not); the first layer's dispatch and the last layer's
// combine tie experts to the tokens' homes. Vertices are each layer's
// copies.
type chainProxy struct {
	L, N, E, P int
	G          int
	exp        [][]int16   // [l][x]
	gpu        [][]int     // [l][x]
	node       [][]int     // [l][x]
	load       [][]float64 // [l][x]
	cnt        [][]int     // [l][e] copies
	of         [][][]int   // [l][e] vertices
	c          [][]float64 // [l][x·N+B]
	nload      [][]float64 // [l][B]
	gload      [][]float64 // [l][g]: tokens over the GPU's speed
	speed      []float64   // [g]
	w          [][]float32 // [l] for l ≥ 1: E×E, e at l−1, f at l
	win        [][]float32 // [l]: E×E, pairs within layer l (nil: none)
	send       float64     // layers below the last: the pairs' weight between GPUs over their weight between nodes (0: none)
	cg         [][]float64 // [l][x·G+g]: x's partners within layer l on GPU g (sender weights)
	term       [][]float64 // [l] for l = 0 and L−1: E×N
	// dtok[l][g] is the tokens on GPU g in layer l, a token with several
	// experts there counted once (to first order: the load less its
	// pairs on the GPU); they leave g for the next layer, so they load
	// its NIC out port. Only for layers with sender pairs.
	dtok [][]float64
	// pairTok is the tokens a pair shares per unit of cg.
	pairTok float64
	// portSec[l] prices dtok[l]'s busiest GPU above floor[l] times the
	// mean, in seconds per token (0: not priced).
	portSec, floor []float64
}

// transitionWeights returns the layer pairs' edge weights: from the
// statistics' all-pairs transitions when they have them, else from the
// per-token paths.
func transitionWeights(st *routing.Stats) ([][]float32, error) {
	L, E, K := st.Layers, st.Experts, st.TopK
	w := make([][]float32, L)
	inv := 1 / float64(K)
	switch {
	case st.Transitions != nil && st.TransitionMode == routing.TransitionAllPairs:
		for l := 1; l < L; l++ {
			w[l] = make([]float32, E*E)
			for i, v := range st.Transitions[l-1] {
				w[l][i] = float32(v * inv)
			}
		}
	case st.Patterns != nil:
		for l := 1; l < L; l++ {
			w[l] = make([]float32, E*E)
		}
		for _, pt := range st.Patterns {
			x := float32(pt.Count * inv)
			for l := 1; l < L; l++ {
				a, b := pt.Experts[(l-1)*K:l*K], pt.Experts[l*K:(l+1)*K]
				for _, e := range a {
					row := w[l][int(e)*E:]
					for _, f := range b {
						row[f] += x
					}
				}
			}
		}
	case st.Transitions != nil:
		for l := 1; l < L; l++ {
			w[l] = make([]float32, E*E)
			for i, v := range st.Transitions[l-1] {
				w[l][i] = float32(v)
			}
		}
	default:
		return nil, errors.New("affinity: the chain flow needs transitions or per-token paths")
	}
	return w, nil
}

func newChainProxy(p Problem, copies [][][]int32, w [][]float32) *chainProxy {
	st, c := p.Stats, p.Cluster
	L, E, N, P, K := st.Layers, st.Experts, c.Nodes, c.GPUsPerNode, st.TopK
	G := c.GPUs()
	cp := &chainProxy{L: L, N: N, E: E, P: P, G: G, w: w,
		exp: make([][]int16, L), gpu: make([][]int, L), node: make([][]int, L), load: make([][]float64, L),
		cnt: make([][]int, L), of: make([][][]int, L), c: make([][]float64, L), nload: make([][]float64, L),
		gload: make([][]float64, L), speed: make([]float64, G), term: make([][]float64, L)}
	for g := range cp.speed {
		cp.speed[g] = c.SpeedOf(g)
	}
	for l := 0; l < L; l++ {
		cp.cnt[l] = make([]int, E)
		cp.of[l] = make([][]int, E)
		cp.nload[l] = make([]float64, N)
		cp.gload[l] = make([]float64, G)
		for e, gs := range copies[l] {
			cp.cnt[l][e] = len(gs)
			for _, g := range gs {
				x := len(cp.exp[l])
				cp.of[l][e] = append(cp.of[l][e], x)
				cp.exp[l] = append(cp.exp[l], int16(e))
				cp.gpu[l] = append(cp.gpu[l], int(g))
				cp.node[l] = append(cp.node[l], int(g)/P)
				ld := st.Load[l][e] / float64(len(gs))
				cp.load[l] = append(cp.load[l], ld)
				cp.nload[l][int(g)/P] += ld
				cp.gload[l][g] += ld / cp.speed[g]
			}
		}
	}
	// Homes: the first layer's dispatch and the last layer's combine.
	if st.Patterns != nil {
		inv := 1 / float64(K)
		for _, l := range []int{0, L - 1} {
			if cp.term[l] != nil {
				continue
			}
			cp.term[l] = make([]float64, E*N)
			for _, pt := range st.Patterns {
				if pt.Source < 0 || int(pt.Source) >= c.GPUs() {
					continue
				}
				A := int(pt.Source) / P
				for _, e := range pt.Experts[l*K : (l+1)*K] {
					cp.term[l][int(e)*N+A] += pt.Count * inv
				}
			}
		}
	}
	if beta := intraWeight(K, N); beta > 0 && st.Patterns != nil {
		cp.win = make([][]float32, L)
		for l := range cp.win {
			cp.win[l] = make([]float32, E*E)
		}
		for _, pt := range st.Patterns {
			x := float32(beta * pt.Count / float64(K))
			for l := 0; l < L; l++ {
				ex := pt.Experts[l*K : (l+1)*K]
				row := cp.win[l]
				for i, e := range ex {
					for _, f := range ex[i+1:] {
						row[int(e)*E+int(f)] += x
						row[int(f)*E+int(e)] += x
					}
				}
			}
		}
	}
	if cp.win != nil {
		cp.send = sendWeight(K, G, N) / intraWeight(K, N)
		cp.cg = make([][]float64, L)
	}
	for l := 0; l < L; l++ {
		V := len(cp.exp[l])
		if cp.send > 0 && l+1 < L {
			cp.cg[l] = make([]float64, V*G)
			for x := 0; x < V; x++ {
				for y := 0; y < V; y++ {
					if y != x {
						cp.cg[l][x*G+cp.gpu[l][y]] += cp.pwSend(l, x, y)
					}
				}
			}
		}
		cp.fillC(l)
	}
	if cp.cg != nil && cp.send > 0 {
		cp.dtok = make([][]float64, L)
		cp.pairTok = float64(K) / (intraWeight(K, N) * cp.send)
		cp.portSec = make([]float64, L)
		cp.floor = make([]float64, L)
		for l := range cp.dtok {
			cg := cp.cgOf(l)
			if cg == nil {
				continue
			}
			cp.dtok[l] = make([]float64, G)
			for x, g := range cp.gpu[l] {
				cp.dtok[l][g] += cp.load[l][x] - cg[x*G+g]*cp.pairTok/2
			}
		}
	}
	return cp
}

// fillC counts layer l's partner weights per node, c[l], from the nodes
// of the layer's vertices and of its neighbours'.
func (cp *chainProxy) fillC(l int) {
	V, N := len(cp.exp[l]), cp.N
	cp.c[l] = make([]float64, V*N)
	for x := 0; x < V; x++ {
		if cp.win != nil {
			for y := 0; y < V; y++ {
				if y != x {
					cp.c[l][x*N+cp.node[l][y]] += cp.pwIn(l, x, y)
				}
			}
		}
		for _, nl := range []int{l - 1, l + 1} {
			if nl < 0 || nl >= cp.L {
				continue
			}
			for y := range cp.exp[nl] {
				cp.c[l][x*N+cp.node[nl][y]] += cp.pw(l, x, nl, y)
			}
		}
	}
}

// pw is the edge weight of vertex x of layer l and vertex y of the
// adjacent layer m (copies split it evenly).
func (cp *chainProxy) pw(l, x, m, y int) float64 {
	e, f := int(cp.exp[l][x]), int(cp.exp[m][y])
	var v float32
	if m == l+1 {
		v = cp.w[m][e*cp.E+f]
	} else {
		v = cp.w[l][f*cp.E+e]
	}
	return float64(v) / float64(cp.cnt[l][e]*cp.cnt[m][f])
}

// intraWeight is the weight of a pair of a token's experts in one layer
// on different nodes, relative to the 1/k of a pair across adjacent
// layers. A token reaches each node B of its layer-l experts once, at
// cost 1 − f(B) (f: the share of its previous experts on B), while the
// cross-layer pairs count B n(B) times, n(B) the layer-l experts on B;
// with 1 − f at its mean 1 − 1/N, the excess (n − 1)⁺ is priced over the
// node's C(n, 2) same-node pairs at pairExcess(k, N) each: every pair cut
// between nodes weighs k·pairExcess(k, N)·(1 − 1/N) in units of 1/k (a
// constant apart).
func intraWeight(k, N int) float64 {
	if N < 2 {
		return 0
	}
	return float64(k) * pairExcess(k, N) * (1 - 1/float64(N))
}

// sendWeight is intraWeight for a pair on different GPUs of a layer below
// the last: the token's partial results leave each GPU of its layer-l
// experts once, for the other nodes its next experts reach, while the
// cross-layer pairs count a GPU once per expert it holds. Once the pairs
// within the next layer have made each reached node count once, a sender
// costs the nodes it reaches away from its own, (N − 1)·(1 − (1 − 1/N)^k)
// for k experts at random, in units of 1/k; the excess of a GPU's senders
// is priced over its same-GPU pairs, the G GPUs being the parts.
func sendWeight(k, G, N int) float64 {
	if N < 2 {
		return 0
	}
	n := float64(N)
	return pairExcess(k, G) * (n - 1) * (1 - math.Pow(1-1/n, float64(k)))
}

// pairExcess is the excess count per same-part pair when k items spread
// at random over n parts: a part holds a binomial(k, 1/n) number m of
// them, and E[(m − 1)⁺] = k/n − 1 + (1 − 1/n)^k spread over its
// E[C(m, 2)] = C(k, 2)/n² pairs (2/m for a part of m).
func pairExcess(k, n int) float64 {
	if k < 2 || n < 2 {
		return 0
	}
	p, kk := 1/float64(n), float64(k)
	return (kk*p - 1 + math.Pow(1-p, kk)) / (kk * (kk - 1) / 2 * p * p)
}

// pwSend is the sender edge weight of vertices x and y of layer l.
func (cp *chainProxy) pwSend(l, x, y int) float64 {
	if cp.send == 0 || l+1 >= cp.L {
		return 0
	}
	return cp.pwIn(l, x, y) * cp.send
}

// pwIn is the edge weight of vertices x and y of layer l.
func (cp *chainProxy) pwIn(l, x, y int) float64 {
	e, f := int(cp.exp[l][x]), int(cp.exp[l][y])
	if cp.win == nil || e == f {
		return 0
	}
	return float64(cp.win[l][e*cp.E+f]) / float64(cp.cnt[l][e]*cp.cnt[l][f])
}

func (cp *chainProxy) tw(l, x, b int) float64 {
	if cp.term[l] == nil {
		return 0
	}
	e := int(cp.exp[l][x])
	return cp.term[l][e*cp.N+b] / float64(cp.cnt[l][e])
}

// cost is the cut weight: edges between nodes, counted once, and the
// home terminals away from their vertex.
func (cp *chainProxy) cost() float64 {
	c := 0.0
	for l := 0; l < cp.L; l++ {
		for x := range cp.exp[l] {
			for b := 0; b < cp.N; b++ {
				if b == cp.node[l][x] {
					continue
				}
				if l+1 < cp.L {
					for y := range cp.exp[l+1] {
						if cp.node[l+1][y] == b {
							c += cp.pw(l, x, l+1, y)
						}
					}
				}
				c += cp.tw(l, x, b)
			}
			if cp.win != nil {
				for y := x + 1; y < len(cp.exp[l]); y++ {
					if cp.node[l][y] != cp.node[l][x] {
						c += cp.pwIn(l, x, y)
					}
					if cp.gpu[l][y] != cp.gpu[l][x] {
						c += cp.pwSend(l, x, y)
					}
				}
			}
		}
	}
	return c
}

// swapDelta is the cut change of swapping the GPUs of x and y of layer l.
func (cp *chainProxy) swapDelta(l, x, y int) float64 {
	d := 0.0
	if a, b := cp.node[l][x], cp.node[l][y]; a != b {
		N := cp.N
		c := cp.c[l]
		d = c[x*N+a] - c[x*N+b] + cp.tw(l, x, a) - cp.tw(l, x, b) +
			c[y*N+b] - c[y*N+a] + cp.tw(l, y, b) - cp.tw(l, y, a) + 2*cp.pwIn(l, x, y)
	}
	if cg := cp.cgOf(l); cg != nil {
		G := cp.G
		ga, gb := cp.gpu[l][x], cp.gpu[l][y]
		d += cg[x*G+ga] - cg[x*G+gb] + cg[y*G+gb] - cg[y*G+ga] + 2*cp.pwSend(l, x, y)
	}
	return d
}

// dtokDelta is the change of dtok[l] on x's GPU and on y's when they
// swap: each loses its vertex's load and its pairs there and gains the
// other's, less the pair of x and y, which stays split.
func (cp *chainProxy) dtokDelta(l, x, y int) (float64, float64) {
	G, cg, f := cp.G, cp.cg[l], cp.pairTok
	ga, gb := cp.gpu[l][x], cp.gpu[l][y]
	d := cp.load[l][y] - cp.load[l][x]
	pxy := cp.pwSend(l, x, y)
	da := d - f*(cg[y*G+ga]-pxy-cg[x*G+ga])
	db := -d - f*(cg[x*G+gb]-pxy-cg[y*G+gb])
	return da, db
}

// portExcess is the change of dtok[l]'s busiest GPU above floor[l] times
// its mean when x and y swap (the busiest GPU's change where it stays
// above).
func (cp *chainProxy) portExcess(l, x, y int) float64 {
	dt := cp.dtok[l]
	ga, gb := cp.gpu[l][x], cp.gpu[l][y]
	da, db := cp.dtokDelta(l, x, y)
	before, after, sum := 0.0, 0.0, 0.0
	for g, v := range dt {
		before = max(before, v)
		sum += v
		switch g {
		case ga:
			v += da
		case gb:
			v += db
		}
		after = max(after, v)
	}
	f := cp.floor[l] / float64(len(dt))
	return max(after, (sum+da+db)*f) - max(before, sum*f)
}

// pricePorts prices every layer's sender ports (dtok) against the start's
// exact report rep, secPerCopy seconds per copy through one NIC port: a
// token on a GPU of layer l goes out of its NIC once for each remote
// node its layer-(l+1) experts reach, which the start measures per token
// (its layer-(l+1) remote copies over Σ dtok[l]); and the busiest out
// port only sets the time above the busiest in port, which the proxy
// does not see, so the excess counts above the start's busiest in port
// (floor, over the mean). The mean is in the cut already.
func (cp *chainProxy) pricePorts(rep *costmodel.Report, secPerCopy float64) {
	if cp.dtok == nil {
		return
	}
	for l := 0; l+1 < cp.L; l++ {
		if cp.dtok[l] == nil {
			continue
		}
		sum := 0.0
		for _, v := range cp.dtok[l] {
			sum += v
		}
		next := &rep.Layers[l+1]
		if sum <= 0 || next.RemoteCopies <= 0 {
			continue
		}
		cp.portSec[l] = next.RemoteCopies / sum * secPerCopy
		cp.floor[l] = inPortRatio(next.Dispatch, cp.P)
	}
}

// inPortRatio is the busiest NIC in port's bytes of the phase D (bytes
// [src][dst], nodes of P GPUs) over the mean port's; 1 without NIC bytes.
func inPortRatio(D [][]float64, P int) float64 {
	_, in, mean := nicPorts(D, P)
	if mean <= 0 {
		return 1
	}
	return slices.Max(in) / mean
}

// nicPorts returns the NIC out and in bytes per GPU of the phase D (bytes
// [src][dst], nodes of P GPUs) and the mean port's bytes.
func nicPorts(D [][]float64, P int) (out, in []float64, mean float64) {
	out, in = make([]float64, len(D)), make([]float64, len(D))
	tot := 0.0
	for s, row := range D {
		for d, v := range row {
			if s/P != d/P {
				out[s] += v
				in[d] += v
				tot += v
			}
		}
	}
	return out, in, tot / float64(len(D))
}

// cgOf is layer l's sender counters (nil: the layer has none).
func (cp *chainProxy) cgOf(l int) []float64 {
	if cp.cg == nil {
		return nil
	}
	return cp.cg[l]
}

func (cp *chainProxy) swap(l, x, y int) {
	N := cp.N
	a, b := cp.node[l][x], cp.node[l][y]
	for _, m := range []int{l - 1, l + 1} {
		if m < 0 || m >= cp.L {
			continue
		}
		for z := range cp.exp[m] {
			wx, wy := cp.pw(m, z, l, x), cp.pw(m, z, l, y)
			cp.c[m][z*N+a] += wy - wx
			cp.c[m][z*N+b] += wx - wy
		}
	}
	if cp.win != nil && a != b {
		for z := range cp.exp[l] {
			wx, wy := cp.pwIn(l, z, x), cp.pwIn(l, z, y)
			if z != x {
				cp.c[l][z*N+a] -= wx
				cp.c[l][z*N+b] += wx
			}
			if z != y {
				cp.c[l][z*N+b] -= wy
				cp.c[l][z*N+a] += wy
			}
		}
	}
	if cg := cp.cgOf(l); cg != nil {
		G := cp.G
		ga, gb := cp.gpu[l][x], cp.gpu[l][y]
		if cp.dtok != nil {
			da, db := cp.dtokDelta(l, x, y)
			cp.dtok[l][ga] += da
			cp.dtok[l][gb] += db
		}
		for z := range cp.exp[l] {
			wx, wy := cp.pwSend(l, z, x), cp.pwSend(l, z, y)
			if z != x {
				cg[z*G+ga] -= wx
				cg[z*G+gb] += wx
			}
			if z != y {
				cg[z*G+gb] -= wy
				cg[z*G+ga] += wy
			}
		}
	}
	cp.nload[l][a] += cp.load[l][y] - cp.load[l][x]
	cp.nload[l][b] += cp.load[l][x] - cp.load[l][y]
	gx, gy := cp.gpu[l][x], cp.gpu[l][y]
	cp.gload[l][gx] += (cp.load[l][y] - cp.load[l][x]) / cp.speed[gx]
	cp.gload[l][gy] += (cp.load[l][x] - cp.load[l][y]) / cp.speed[gy]
	cp.node[l][x], cp.node[l][y] = b, a
	cp.gpu[l][x], cp.gpu[l][y] = cp.gpu[l][y], cp.gpu[l][x]
}

func (cp *chainProxy) holds(l, g, e int) bool {
	for _, x := range cp.of[l][e] {
		if cp.gpu[l][x] == g {
			return true
		}
	}
	return false
}
