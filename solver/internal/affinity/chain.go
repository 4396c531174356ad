package affinity

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/task"
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
	delta := func(l, x, y int) float64 {
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

// balanceNodes balances every node's copies over its GPUs: from the copies'
// own arrangement and from a largest-first packing, it swaps copies
// between the node's busiest GPU and its others while that lowers the
// pair's larger load (tokens over speed), and keeps the arrangement with
// the lower peak, so no node ends busier than it came in. Copies keep
// their node, and no GPU gets two copies of one expert.
func balanceNodes(copies [][]int32, load []float64, slots []int, speed []float64, P int) [][]int32 {
	G := len(slots)
	N := G / P
	type cpy struct {
		e, g int
		x    float64
	}
	byNode := make([][]cpy, N)
	for e, gs := range copies {
		for _, g := range gs {
			byNode[int(g)/P] = append(byNode[int(g)/P], cpy{e, int(g), load[e] / float64(len(gs))})
		}
	}
	out := make([][]int32, len(copies))
	for b, list := range byNode {
		slices.SortStableFunc(list, func(u, v cpy) int {
			switch {
			case u.x > v.x:
				return -1
			case u.x < v.x:
				return 1
			}
			return u.e - v.e
		})
		has := func(held []int, e, except int) bool {
			return slices.ContainsFunc(held, func(q int) bool { return q != except && list[q].e == e })
		}
		// improve swaps copies between the busiest GPU and the others
		// and returns the peak.
		improve := func(held [][]int, gl []float64) float64 {
			for iter := 0; iter < len(list)*P; iter++ {
				top := 0
				for j := range gl {
					if gl[j]/speed[b*P+j] > gl[top]/speed[b*P+top] {
						top = j
					}
				}
				peak := gl[top] / speed[b*P+top]
				bi, bj, bo, bk := -1, -1, -1, -1
				best := peak
				for ii, i := range held[top] {
					for j := range held {
						if j == top {
							continue
						}
						for kk, k := range held[j] {
							ci, ck := list[i], list[k]
							if ci.e == ck.e || has(held[j], ci.e, k) || has(held[top], ck.e, i) {
								continue
							}
							m := math.Max((gl[top]-ci.x+ck.x)/speed[b*P+top], (gl[j]-ck.x+ci.x)/speed[b*P+j])
							if m < best*(1-1e-12) {
								best, bi, bj, bo, bk = m, ii, j, i, kk
							}
						}
					}
				}
				if bi < 0 {
					break
				}
				k := held[bj][bk]
				held[top][bi], held[bj][bk] = k, bo
				gl[top] += list[k].x - list[bo].x
				gl[bj] += list[bo].x - list[k].x
			}
			peak := 0.0
			for j := range gl {
				peak = max(peak, gl[j]/speed[b*P+j])
			}
			return peak
		}
		// The copies' own arrangement.
		own := make([][]int, P)
		ownLoad := make([]float64, P)
		for i, c := range list {
			own[c.g-b*P] = append(own[c.g-b*P], i)
			ownLoad[c.g-b*P] += c.x
		}
		bestHeld, bestPeak := own, improve(own, ownLoad)
		// Largest first.
		held := make([][]int, P)
		gl := make([]float64, P)
		ok := true
		for i, c := range list {
			best := -1
			for j := 0; j < P; j++ {
				g := b*P + j
				if len(held[j]) >= slots[g] || has(held[j], c.e, -1) {
					continue
				}
				if best < 0 || gl[j]/speed[g] < gl[best]/speed[b*P+best] {
					best = j
				}
			}
			if best < 0 {
				ok = false
				break
			}
			held[best] = append(held[best], i)
			gl[best] += c.x
		}
		if ok {
			if pk := improve(held, gl); pk < bestPeak {
				bestHeld = held
			}
		}
		for j, idx := range bestHeld {
			for _, i := range idx {
				out[list[i].e] = append(out[list[i].e], int32(b*P+j))
			}
		}
	}
	for e := range out {
		slices.Sort(out[e])
	}
	return out
}

// SolveChain improves p.Start for the chain flow: the layers are coupled
// through their transitions, so one annealing of the cross-layer proxy
// places every layer's copies on GPUs (on nodes for the receivers, on GPUs
// for the senders and the balance), stopping now and then to relabel the
// nodes so that every layer lines up with the one before (relabel); where
// the statistics have no paths, each node's copies are then balanced over
// its GPUs.
func SolveChain(ctx context.Context, p Problem, opts Options) (*Result, error) {
	st, c := p.Stats, p.Cluster
	if p.Flow != costmodel.FlowChain {
		return nil, errors.New("affinity: SolveChain is for the chain flow")
	}
	G := c.GPUs()
	if len(p.Slots) != G {
		return nil, fmt.Errorf("affinity: %d slot counts for %d GPUs", len(p.Slots), G)
	}
	L := st.Layers
	if p.Start == nil || len(p.Start.Layers) != L {
		return nil, errors.New("affinity: no start plan for every layer")
	}
	copies := make([][][]int32, L)
	for l := range copies {
		copies[l] = make([][]int32, st.Experts)
		for e, gs := range p.Start.ExpertGPUs(l) {
			for _, g := range gs {
				copies[l][e] = append(copies[l][e], int32(g))
			}
		}
	}
	res := &Result{Copies: make([][][]placement.GPU, L)}
	if !opts.Limit.ByWork() && !time.Now().Before(opts.Limit.Deadline) || ctx.Err() != nil {
		// No time left: the start, without building the proxy (a pass
		// over every token path) to search for nothing.
		for l := range res.Copies {
			res.Copies[l] = p.Start.ExpertGPUs(l)
		}
		return res, nil
	}
	w, err := transitionWeights(st)
	if err != nil {
		return nil, err
	}
	cp := newChainProxy(p, copies, w)
	keep := make([]bool, L) // layers that keep their start
	startPeak := make([]float64, L)
	for l := range startPeak {
		startPeak[l] = cp.peak(l)
	}
	rep, evalTime := p.StartReport, p.EvalTime
	if rep == nil {
		t0 := time.Now()
		if rep, err = p.Evaluate(p.Start); err != nil {
			return nil, err
		}
		evalTime = time.Since(t0)
	}
	tb := p.Model.TokenBytes()
	exact := 0.0
	for _, lr := range rep.Layers {
		exact += lr.CrossNodeBytes / tb
	}
	var spare int64 // work the proxy cannot use, for the exact polish
	if p.budgeted() {
		// Under a move budget the proxy (which relabels whole nodes) and
		// the balancing within nodes do not run: the exact annealing and
		// the polish, which count every slot they change, get the work
		// (the polish's tenth on top of it, as always).
		spare = opts.Limit.Work - opts.Limit.Work/10
	} else if cut := cp.cost(); cut > 0 && c.Nodes > 1 {
		perTok, _ := c.Coefficients(p.Model)
		lim := opts.Limit
		if !lim.ByWork() {
			lim.Deadline = time.Now().Add(time.Duration(opts.Chain.proxy() * float64(time.Until(lim.Deadline))))
		} else {
			// Past annealSweeps sweeps of its neighbourhood (every copy to
			// every GPU in every layer) the proxy's annealing has seen
			// all it can; exact moves are worth more than more of it.
			V := 0
			for l := range cp.exp {
				V += len(cp.exp[l])
			}
			need := (int64(annealSweeps)*int64(V)*int64(G) + chainProxyPerUnit - 1) / chainProxyPerUnit
			if lim.Work > need {
				spare, lim.Work = lim.Work-need, need
			}
		}
		cp.pricePorts(rep, tb/c.NICBytesPerSec())
		// Blocks of six layers or more: four searched a round.
		scs := blockSchedules(ctx, lim, opts.Parallel, L, 6, chainProxyPerUnit)
		kind := nodeKinds(p.Slots, cp.speed, c.Nodes, c.GPUsPerNode)
		// Relabels during the annealing, relabelsMax by work; by time as
		// many as fit in a tenth of its share, at what the start's took
		// (the start is the balancer's plan: its relabel moves little).
		relabels := relabelsMax
		if !lim.ByWork() {
			t0 := time.Now()
			cp.relabel(kind)
			if took := time.Since(t0); took > 0 {
				relabels = min(relabelsMax, int(time.Until(lim.Deadline)/(10*took)))
			}
		}
		moves := cp.anneal(uint64(L), scs, opts.Parallel, exact/cut, perTok, tb/c.NICBytesPerSec()/float64(G), kind, relabels)
		cp.relabel(kind)
		res.Tries = moves / chainProxyPerUnit
		// No layer ends less balanced than it started (the start is the
		// balancer's plan): the proxy prices the cut as an average over
		// the NIC ports, which the busiest port exceeds, so its trades of
		// balance for transitions are dearer on the exact cost than it
		// sees. A layer whose busiest GPU the time left did not bring
		// back keeps its start; one where no swap lowers it further keeps
		// what the swaps reached (reverting it would give back all of its
		// gain for the little its balance lacks).
		var dl time.Time
		if !opts.Limit.ByWork() {
			dl = opts.Limit.Deadline
		}
		for l := 0; l < L; l++ {
			n, ok := cp.capPeak(l, startPeak[l], exact/cut, tb/c.NICBytesPerSec()/float64(G), dl)
			res.Tries += int64(n)
			if !ok && !dl.IsZero() && !time.Now().Before(dl) {
				keep[l] = true
			}
		}
	}
	speed := make([]float64, G)
	for g := range speed {
		speed[g] = c.SpeedOf(g)
	}
	for l := 0; l < L; l++ {
		from := cp.copies(l)
		if keep[l] {
			from = copies[l]
		}
		// With the tokens' paths the annealing has arranged each node's
		// GPUs for their senders as well as for balance (capPeak bounds
		// the busiest); without, only balance tells them apart.
		bal := from
		if cp.cgOf(l) == nil && !p.budgeted() {
			bal = balanceNodes(from, st.Load[l], p.Slots, speed, c.GPUsPerNode)
		}
		res.Copies[l] = make([][]placement.GPU, st.Experts)
		for e, gs := range bal {
			for _, g := range gs {
				res.Copies[l][e] = append(res.Copies[l][e], placement.GPU(g))
			}
		}
	}
	spare = exactChain(ctx, p, opts, spare, res, rep, evalTime)
	polishChain(ctx, p, opts, spare, res, rep, evalTime)
	return res, nil
}

// chainProxyPerUnit is how many chain proxy moves one work unit (one
// exact move) buys. Unlike the home flow's proxy (proxyPerUnit), a chain
// proxy move walks the layer's GPUs for its balance and ports, and an
// accepted one the vertices of three layers. Timed inside 20 s solves on
// the 32k-token DeepSeek-V3-shaped trace (experiments chain): a proxy
// move took 1.41 µs on 4 × 8 GPUs and 3.32 µs on 8 × 8, one core; an
// exact move, as its annealing counts them (those a layer's cap rejects
// before its tokens are walked included), 44 µs and 109 µs of CPU. The
// smaller ratio, so that a work budget's proxy ends sooner than its units
// suggest, never later. At 128, `--effort 1` ran the proxy for about four
// minutes there; at 10 (its timings of an older proxy, 7.7 µs against
// 78 µs) the proxy took every unit of `--effort 2` and the exact
// annealing got none.
const chainProxyPerUnit = 31

// polishMoveUnits is how many work units one move of the chain's polish
// counts (a swap scored by the cost model's incremental evaluator, which
// prices two layers' all-to-alls over every GPU pair): the ratio of its
// time to an exact move's (above) on the 32k-token DeepSeek-V3-shaped
// trace, 1.08 ms (BenchmarkChainSwap32k/evaluator) against 44 µs on
// 4 × 8 GPUs, 0.99 ms against 109 µs on 8 × 8. The larger ratio, so that
// a work budget's polish ends sooner than its units suggest, never later.
// At 1, `--effort 1` with a running plan, copies and a move budget gave
// the polish 0.95 M moves: 36 s on FLAME's first 256 tokens (2 × 8 GPUs),
// and, at 1.06 ms a move, about 17 minutes on the 32k trace.
const polishMoveUnits = 24

// relabelsMax is how many times the chain's annealing stops to relabel
// the nodes (chainProxy.relabel), at even steps of its progress. On a
// trace with blocks of experts that persist over the layers (4 × 8 GPUs,
// 256 experts, 30 s) the plan's transitions were 4.28, 4.22 and 4.19 per
// token-layer with 0, 4 and 16 (5.29 with no relabel at all); on the
// DeepSeek-V3-shaped synthetic trace, where it finds little to relabel,
// within the noise of none.
const relabelsMax = 16

// exactChain anneals res on the exact chain counters (chainExact) where
// they apply, no layer's compute tail above the start's (or, where the
// search could not bring it back, above where it is now). By time it
// gets Exact/(1 − Proxy) of what is left less one evaluation (opts.Chain)
// (the polish after it gets the rest); by work, half of spare, and it
// returns the rest. The best plan it visits replaces res.
func exactChain(ctx context.Context, p Problem, opts Options, spare int64, res *Result, start *costmodel.Report, evalTime time.Duration) int64 {
	lim := task.Limit{Work: spare / 2}
	if !opts.Limit.ByWork() {
		left := time.Until(opts.Limit.Deadline) - evalTime
		share := opts.Chain.exact() / (1 - opts.Chain.proxy())
		if left <= 0 {
			return spare
		}
		lim = task.Limit{Deadline: time.Now().Add(time.Duration(share * float64(left)))}
	} else if lim.Work == 0 {
		return spare
	}
	L := len(res.Copies)
	tcap := make([]float64, L)
	cx := newChainExact(p, res.Copies, tcap)
	if cx == nil {
		return spare
	}
	cx.bud = newChainBudgets(p, res.Copies)
	for l := range tcap {
		tcap[l] = max(start.Layers[l].ComputeTail.Seconds()+1e-9, cx.tail(l, -1, -1, 0)) * (1 + 1e-12)
	}
	// One schedule per block of layers (at most one per three layers, as
	// anneal runs them).
	scs := blockSchedules(ctx, lim, opts.Parallel, L, 3, 1)
	neigh := annealSweeps * float64(L*cx.E*cx.G)
	gpu, n := cx.anneal(uint64(L)<<32|0x657861, scs, opts.Parallel, func(rate float64) bool {
		if lim.ByWork() {
			return float64(lim.Work) >= neigh
		}
		return rate*time.Until(lim.Deadline).Seconds() >= neigh
	})
	res.Tries += n
	res.Copies = gpuCopies(gpu)
	return spare - lim.Work
}

// polishChain refines res on the exact cost model, which the proxy only
// approximates (a clique expansion of each token's nodes): a simulated
// annealing of slot swaps scored by the incremental evaluator. By work it
// gets a tenth of the budget on top, and spare, what the proxy could not
// use; by time, what is left of the limit,
// when that covers building the evaluator (one evaluation) with one
// evaluation to spare, since the caller scores the result. It starts hot
// only when it can try every swap of the neighbourhood many times over,
// as the home flow's last annealing; else it refines what it was given.
// No layer's busiest GPU ends above the start's (the proxy's promise).
// The best plan it visits is kept; one no better leaves res as it is.
func polishChain(ctx context.Context, p Problem, opts Options, spare int64, res *Result, start *costmodel.Report, evalTime time.Duration) {
	lim := task.Limit{Work: opts.Limit.Work/10 + spare}
	if !opts.Limit.ByWork() {
		if evalTime <= 0 || time.Until(opts.Limit.Deadline) < 3*evalTime {
			return
		}
		lim = task.Limit{Deadline: opts.Limit.Deadline.Add(-evalTime)}
	} else if lim.Work == 0 {
		return
	} else {
		// Its moves, not its units.
		lim.Work = max(1, lim.Work/polishMoveUnits)
	}
	G := p.Cluster.GPUs()
	ev, err := p.NewEvaluator(placement.FromReplicas(G, res.Copies, "affinity"))
	if err != nil {
		return
	}
	L := ev.Layers()
	// No layer's compute tail goes above the start's (or, where the
	// search could not bring it back, above where it is now).
	tailCap := make([]float64, L)
	for l := range tailCap {
		tailCap[l] = max(start.Layers[l].ComputeTail.Seconds()+1e-9, ev.LayerTail(l)) * (1 + 1e-12)
	}
	rng := rand.New(rand.NewPCG(uint64(L), 0x706f6c))
	bud := newChainBudgets(p, res.Copies)
	// changed is the move budget's count of a slot swap (0 without one).
	changed := func(l int, lp placement.LayerPlan, a, b int) int {
		if bud == nil {
			return 0
		}
		return bud[l].SwapChanged(int(lp.SlotGPU[a]), int(lp.SlotExpert[a]), int(lp.SlotGPU[b]), int(lp.SlotExpert[b]))
	}
	// movedSlot is a random slot of lp whose copy the running plan does
	// not have there, or −1.
	movedSlot := func(l int, lp placement.LayerPlan) int {
		b := bud[l]
		if b.changed == 0 {
			return -1
		}
		n := rng.IntN(b.changed)
		for i, e := range lp.SlotExpert {
			if b.Off(int(lp.SlotGPU[i]), int(e)) == 1 {
				if n == 0 {
					return i
				}
				n--
			}
		}
		return -1
	}
	// pick draws a swap of two slots of one layer that keeps the plan
	// valid (different GPUs, different experts, neither already on the
	// other's GPU) and within the move budget, with its count; under a
	// nearly spent budget half of them start from a moved slot, and half
	// of those take a moved partner (such a swap never adds to the
	// count).
	pick := func() (costmodel.Move, int, bool) {
		for range 64 {
			l := rng.IntN(L)
			lp := ev.Layer(l)
			n := len(lp.SlotGPU)
			if n < 2 {
				continue
			}
			a, b := rng.IntN(n), rng.IntN(n)
			if bud != nil && bud[l].Max > 0 && bud[l].changed >= bud[l].Max-1 && rng.IntN(2) == 0 {
				if a = movedSlot(l, lp); a < 0 {
					continue
				}
				if rng.IntN(2) == 0 {
					if b = movedSlot(l, lp); b < 0 {
						continue
					}
				}
			}
			ga, gb, ea, eb := lp.SlotGPU[a], lp.SlotGPU[b], lp.SlotExpert[a], lp.SlotExpert[b]
			if ga == gb || ea == eb {
				continue
			}
			dc := changed(l, lp, a, b)
			if bud != nil && bud[l].Max > 0 && bud[l].changed+dc > bud[l].Max {
				continue
			}
			clash := false
			for s := range lp.SlotGPU {
				if (lp.SlotGPU[s] == gb && lp.SlotExpert[s] == ea) || (lp.SlotGPU[s] == ga && lp.SlotExpert[s] == eb) {
					clash = true
					break
				}
			}
			if !clash {
				return costmodel.Move{Kind: costmodel.MoveSwap, Layer: l, Slot: a, Other: b}, dc, true
			}
		}
		return costmodel.Move{}, 0, false
	}
	// sec is a changed slot's charge in layer l.
	sec := func(l int) float64 {
		if bud == nil {
			return 0
		}
		return bud[l].SlotSec
	}
	t0, n0 := 0.0, 0
	t1 := time.Now()
	for range 4 * L {
		if m, _, ok := pick(); ok {
			if d, err := ev.Delta(m); err == nil {
				t0 += math.Abs(d)
				n0++
			}
		}
	}
	// Swaps per second, from that sample.
	rate := float64(4*L) / max(time.Since(t1).Seconds(), 1e-9)
	if n0 == 0 || t0 == 0 {
		return
	}
	t0 /= float64(n0)
	slots := 0
	for _, v := range p.Slots {
		slots += v
	}
	sc := newSchedule(ctx, lim, 1)
	if lim.ByWork() {
		if float64(lim.Work) < annealSweeps*float64(L*slots*G) {
			t0 *= coolTo
		}
	} else if rate*time.Until(lim.Deadline).Seconds() < annealSweeps*float64(L*slots*G) {
		t0 *= coolTo
	}
	// The walk may pass through plans with a layer over its cap, paying
	// the excess tail once more on top of the time it adds; only plans
	// within every cap can become the best kept.
	cur := ev.Cost()
	for l := range bud {
		cur += bud[l].SlotSec * float64(bud[l].changed)
	}
	over := make([]float64, L) // tail above the cap per layer
	nOver := 0
	best, bestPlan := cur, (*placement.Plan)(nil)
	atBest := true
	for {
		prog, ok := sc.next()
		if !ok {
			break
		}
		m, dc, ok := pick()
		if !ok {
			break
		}
		d, err := ev.Delta(m)
		if err != nil {
			return
		}
		d += sec(m.Layer) * float64(dc)
		temp := t0 * math.Pow(coolTo, prog)
		u := rng.Float64()
		accept := func(x float64) bool { return x <= 0 || u < math.Exp(-x/temp) }
		l := m.Layer
		if over[l] == 0 && !accept(d) {
			continue // the penalty can only add to d
		}
		var snap *placement.Plan
		if atBest {
			snap = ev.Plan()
		}
		if err := ev.Apply(m); err != nil {
			return
		}
		o := max(0, ev.LayerTail(l)-tailCap[l])
		if !accept(d + o - over[l]) {
			if err := ev.Apply(m); err != nil { // a swap is its own inverse
				return
			}
			continue
		}
		cur += d
		if bud != nil {
			bud[l].changed += dc
		}
		switch {
		case o > 0 && over[l] == 0:
			nOver++
		case o == 0 && over[l] > 0:
			nOver--
		}
		over[l] = o
		if nOver == 0 && (cur < best*(1-1e-12) || (atBest && cur <= best)) {
			best, atBest, bestPlan = cur, true, nil
		} else if atBest {
			bestPlan, atBest = snap, false
		}
	}
	res.Tries += sc.done
	out := bestPlan
	if atBest || out == nil {
		out = ev.Plan()
	}
	for l := range res.Copies {
		res.Copies[l] = out.ExpertGPUs(l)
	}
}
