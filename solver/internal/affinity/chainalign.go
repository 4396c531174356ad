package affinity

import "sync"

// chainAligner aligns the chain flow's layers with their neighbours, a
// sweep at a time: each layer's experts move, by swaps that keep every
// GPU's slots and its compute within the layer's busiest GPU's, to the
// nodes where their tokens' experts of the layer before are (the first
// layer's: where their tokens' homes are), so that a token's partial
// results stay on one node from one layer to the next as far as its
// experts allow (ExFlow's inter-layer affinity, placed greedily instead
// of by an ILP). The first sweep looks back only, so that the layers
// line up one after the other from the first; later sweeps weigh the
// layer after as well (after the last layer, the homes the combine
// returns to).
type chainAligner struct {
	p     Problem
	cur   [][][]int32 // [l][e]: the expert's one GPU
	comp  func(g int, x float64) float64
	procs int
	aff   [][]float64 // per goroutine, E·N
	K, N  int
	// Layer-major copies of the token paths: ex[l][t·K:(t+1)·K] are
	// token t's layer-l experts; node[l][e] is expert e's node, home[t]
	// token t's home node (−1: none).
	ex   [][]int16
	node [][]int8
	cnt  []float64
	home []int8
}

// newChainAligner returns an aligner of copies (changed in place), or nil
// where it does not apply: replicas, no per-token paths, one node, more
// than 64 nodes.
func newChainAligner(p Problem, copies [][][]int32, procs int) *chainAligner {
	st, c := p.Stats, p.Cluster
	L, N, G := st.Layers, c.Nodes, c.GPUs()
	if st.Patterns == nil || N < 2 || N > 64 || len(copies) != L || len(p.Slots) != G {
		return nil
	}
	for l := range copies {
		for _, gs := range copies[l] {
			if len(gs) != 1 || int(gs[0]) >= G {
				return nil
			}
		}
	}
	terms := p.Scenario.Terms()
	a := &chainAligner{p: p, cur: copies, procs: max(1, procs),
		comp: func(g int, x float64) float64 { return terms.Compute(g, x, float64(p.Slots[g])) }}
	K, T, P := st.TopK, len(st.Patterns), c.GPUsPerNode
	a.K, a.N = K, N
	a.ex, a.node = make([][]int16, L), make([][]int8, L)
	a.cnt, a.home = make([]float64, T), make([]int8, T)
	for l := range a.ex {
		a.ex[l] = make([]int16, 0, T*K)
		a.node[l] = make([]int8, st.Experts)
		for e, gs := range copies[l] {
			a.node[l][e] = int8(int(gs[0]) / P)
		}
	}
	for t, pt := range st.Patterns {
		if len(pt.Experts) != L*K {
			return nil
		}
		for l := range a.ex {
			a.ex[l] = append(a.ex[l], pt.Experts[l*K:(l+1)*K]...)
		}
		a.cnt[t], a.home[t] = pt.Count, -1
		if pt.Source >= 0 && int(pt.Source) < G {
			a.home[t] = int8(int(pt.Source) / P)
		}
	}
	a.aff = make([][]float64, a.procs)
	for i := range a.aff {
		a.aff[i] = make([]float64, st.Experts*N)
	}
	return a
}

// sweep aligns every layer once (sweep 0 looking back only) and returns
// the swaps made.
func (a *chainAligner) sweep(sweep int) int {
	st, N, P := a.p.Stats, a.p.Cluster.Nodes, a.p.Cluster.GPUsPerNode
	n := 0
	for l := range a.cur {
		a.affinity(l, sweep > 0)
		n += alignLayer(st.Load[l], a.cur[l], a.aff[0], a.comp, N, P)
		for e, gs := range a.cur[l] {
			a.node[l][e] = int8(int(gs[0]) / P)
		}
	}
	return n
}

// affinity fills a.aff[0] with layer l's node affinities (affinityRange),
// the tokens split among the goroutines.
func (a *chainAligner) affinity(l int, next bool) {
	T := len(a.cnt)
	var wg sync.WaitGroup
	for i := range a.procs {
		wg.Go(func() { a.affinityRange(l, next, a.aff[i], i*T/a.procs, (i+1)*T/a.procs) })
	}
	wg.Wait()
	for _, o := range a.aff[1:] {
		for j, v := range o {
			a.aff[0][j] += v
		}
	}
}

// affinityRange fills aff (E·N) with layer l's node affinities from the
// tokens [lo, hi): for every expert, its tokens' experts of layer l − 1
// on each node (for the first layer, its tokens' homes), with next also
// those of layer l + 1 (after the last layer, the homes the combine
// returns to), and alignIntra times the token's other layer-l experts
// there (a token reaches a node once, however many of its experts the
// node holds).
func (a *chainAligner) affinityRange(l int, next bool, aff []float64, lo, hi int) {
	L, K, N := len(a.ex), a.K, a.N
	clear(aff)
	on := make([]float64, N)
	for t := lo; t < hi; t++ {
		clear(on)
		for _, m := range [2]int{l - 1, l + 1} {
			switch {
			case m == l+1 && !next:
			case m >= 0 && m < L:
				nm := a.node[m]
				for _, e := range a.ex[m][t*K : (t+1)*K] {
					on[nm[e]]++
				}
			case a.home[t] >= 0:
				on[a.home[t]]++
			}
		}
		nl := a.node[l]
		ex := a.ex[l][t*K : (t+1)*K]
		for _, f := range ex {
			on[nl[f]] += alignIntra
		}
		c := a.cnt[t]
		for _, f := range ex {
			row := aff[int(f)*N : int(f)*N+N]
			own := int(nl[f])
			for b := range row {
				v := on[b]
				if b == own {
					v -= alignIntra
				}
				row[b] += c * v
			}
		}
	}
}

// alignLayer improves one layer's experts (loads load, the start's
// copies start, one GPU each) for their node affinities aff (E·N: how
// many of an expert's tokens' experts of the layer before each node
// holds, or its tokens' homes): it swaps pairs of experts on different
// nodes while that raises the affinity of the two to their nodes, each
// expert in turn taking its best such partner, keeping every GPU's load
// (tokens over speed) within the start's busiest; the slots stay as they
// are. The affinities do not depend on where the layer's other experts
// are, so they are counted once. It changes start in place and returns
// the swaps made.
func alignLayer(load []float64, start [][]int32, aff []float64, comp func(g int, x float64) float64, N, P int) int {
	E := len(load)
	gpu := make([]int, E)
	var gload []float64
	for e, gs := range start {
		gpu[e] = int(gs[0])
		for len(gload) <= gpu[e] {
			gload = append(gload, 0)
		}
		gload[gpu[e]] += load[e]
	}
	capG := 0.0
	for g, x := range gload {
		capG = max(capG, comp(g, x))
	}
	capG *= 1 + 1e-12
	// Every pass is E² checks; a pass that swaps nothing ends it, and
	// each swap raises the affinity, so the passes end.
	n := 0
	for improved := true; improved; {
		improved = false
		for e := range E {
			a := gpu[e]
			A := a / P
			best, bf := 1e-9*(aff[e*N+A]+1), -1
			for f := range E {
				b := gpu[f]
				B := b / P
				if B == A {
					continue
				}
				d := aff[e*N+B] - aff[e*N+A] + aff[f*N+A] - aff[f*N+B]
				if d <= best {
					continue
				}
				if comp(a, gload[a]+load[f]-load[e]) <= capG && comp(b, gload[b]+load[e]-load[f]) <= capG {
					best, bf = d, f
				}
			}
			if bf < 0 {
				continue
			}
			b := gpu[bf]
			gload[a] += load[bf] - load[e]
			gload[b] += load[e] - load[bf]
			gpu[e], gpu[bf] = b, a
			improved = true
			n++
		}
	}
	for e, g := range gpu {
		start[e][0] = int32(g)
	}
	return n
}

// alignIntra is the weight of a token's other experts of the same layer
// in an expert's node affinity, against 1 for each of its experts of the
// layers before and after. On the 32k-token DeepSeek-V3-shaped trace
// (4 × 8 GPUs, from EPLB's plan, two sweeps then four) the cross-node
// transitions per token-layer fell from 19.73 to 18.76 with 0, 18.63
// with 1, 18.65 then 18.47 with 2, 18.71 then 18.47 with 4 and 18.81
// then 18.51 with 8.
const alignIntra = 2.0
