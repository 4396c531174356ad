package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/routing"
)

// nodeLayer is one layer of the node-level experiments: one copy per
// expert, tok[e] the patterns that use e, w their weights and home their
// home nodes (the sources', else spread evenly), load[e] Σ w over tok[e],
// mean the node mean of the load, eplb EPLB's node of every expert's
// first copy.
type nodeLayer struct {
	l, N, T      int
	tok          [][]int32
	w, load      []float64
	home, eplb   []int
	rank         []int // every pattern's source GPU
	mean, tokens float64
}

// nodeLayers builds the node experiments' layers of st on N nodes of 8
// GPUs: one copy per expert, EPLB's nodes for the first copies.
func nodeLayers(st *routing.Stats, N int, layers []int) ([]nodeLayer, error) {
	const P = 8
	G := N * P
	plan, err := baseline.EPLB(st, G, baseline.EPLBOptions{Nodes: N})
	if err != nil {
		return nil, err
	}
	E, K, T := st.Experts, st.TopK, len(st.Patterns)
	home := make([]int, T)
	rank := make([]int, T)
	w := make([]float64, T)
	for i, pt := range st.Patterns {
		w[i] = pt.Count
		rank[i] = i % G
		if pt.Source >= 0 {
			rank[i] = int(pt.Source) % G
		}
		home[i] = rank[i] / P
	}
	var out []nodeLayer
	for _, l := range layers {
		nl := nodeLayer{l: l, N: N, T: T, tok: make([][]int32, E), w: w, load: make([]float64, E), home: home, rank: rank, eplb: make([]int, E), tokens: st.Tokens}
		for i, pt := range st.Patterns {
			for _, e := range pt.Experts[l*K : (l+1)*K] {
				nl.tok[e] = append(nl.tok[e], int32(i))
				nl.load[e] += pt.Count
			}
		}
		for e, gs := range plan.ExpertGPUs(l) {
			nl.eplb[e] = int(gs[0]) / P
		}
		for _, v := range nl.load {
			nl.mean += v / float64(N)
		}
		out = append(out, nl)
	}
	return out, nil
}

// anneal is a plain simulated annealing on the exact count (distinct
// remote nodes per token), swaps of two experts between nodes, every
// node's load held under capf × the mean, for lim from start. It returns
// start's count, the best count found under the cap and that plan's node
// busiest/mean.
func (nl *nodeLayer) anneal(start []int, capf float64, lim time.Duration) (r0, best, imb float64) {
	r0, best, imb, _ = nl.annealPlan(start, capf, lim)
	return r0, best, imb
}

// annealPlan is anneal that also returns the best plan's node of every
// expert.
func (nl *nodeLayer) annealPlan(start []int, capf float64, lim time.Duration) (r0, best, imb float64, bestNode []int) {
	N, T, E := nl.N, nl.T, len(start)
	tok, w, home, load := nl.tok, nl.w, nl.home, nl.load
	node := slices.Clone(start)
	nload := make([]float64, N)
	cnt := make([]uint8, T*N)
	for e, b := range node {
		nload[b] += load[e]
		for _, i := range tok[e] {
			cnt[int(i)*N+b]++
		}
	}
	remote := 0.0
	for i := range T {
		for b := range N {
			if cnt[i*N+b] > 0 && b != home[i] {
				remote += w[i]
			}
		}
	}
	r0 = remote
	// mv moves e to node b and returns the change of the count.
	mv := func(e, b int) float64 {
		a, d := node[e], 0.0
		for _, i32 := range tok[e] {
			i := int(i32)
			cnt[i*N+a]--
			if cnt[i*N+a] == 0 && a != home[i] {
				d -= w[i]
			}
			if cnt[i*N+b] == 0 && b != home[i] {
				d += w[i]
			}
			cnt[i*N+b]++
		}
		node[e] = b
		return d
	}
	over := func() float64 {
		o := 0.0
		for _, v := range nload {
			o += max(0, v-capf*nl.mean)
		}
		return o
	}
	rng := rand.New(rand.NewPCG(uint64(nl.l), 7))
	// Hot temperature: the mean |Δ| of random swaps; cooled over three
	// decades.
	t0, n0 := 0.0, 0
	for range 4 * E {
		e, f := rng.IntN(E), rng.IntN(E)
		a, b := node[e], node[f]
		if a == b {
			continue
		}
		d := mv(e, b) + mv(f, a)
		mv(e, a)
		mv(f, b)
		t0 += math.Abs(d)
		n0++
	}
	t0 /= float64(max(n0, 1))
	best = math.Inf(1)
	bestNode = slices.Clone(node)
	if over() == 0 {
		best = remote
	}
	begin := time.Now()
	for time.Since(begin) < lim {
		p := time.Since(begin).Seconds() / lim.Seconds()
		temp := t0 * math.Pow(1e-3, p)
		for range 256 {
			e, f := rng.IntN(E), rng.IntN(E)
			a, b := node[e], node[f]
			if a == b {
				continue
			}
			o0 := over()
			nload[a] += load[f] - load[e]
			nload[b] += load[e] - load[f]
			if o1 := over(); o1 > 0 && o1 >= o0 {
				nload[a] -= load[f] - load[e]
				nload[b] -= load[e] - load[f]
				continue
			}
			d := mv(e, b) + mv(f, a)
			if d <= 0 || rng.Float64() < math.Exp(-d/temp) {
				remote += d
				if remote < best && over() == 0 {
					best = remote
					copy(bestNode, node)
				}
				continue
			}
			mv(e, a)
			mv(f, b)
			nload[a] -= load[f] - load[e]
			nload[b] -= load[e] - load[f]
		}
	}
	clear(nload)
	for e, b := range bestNode {
		nload[b] += load[e]
	}
	for _, v := range nload {
		imb = max(imb, v/nl.mean)
	}
	return r0, best, imb, bestNode
}

// relax minimizes the expected count of independent rounding, every expert
// a distribution x_e over the nodes, on the polytope of exactly balanced
// node loads: entropic mirror descent (step eta relative to the expert's
// load), each iterate projected by Sinkhorn scaling (rows sum to 1, node
// loads to the mean). It rounds by (expert, node) shares, largest first,
// E/N experts per node, and returns that start and the relaxed count.
func (nl *nodeLayer) relax(iters int, eta float64) ([]int, float64) {
	N, E := nl.N, len(nl.eplb)
	th := make([]float64, E*N)
	for e, b := range nl.eplb {
		th[e*N+b] = 0.5
	}
	x := make([]float64, E*N)
	g := make([]float64, E*N)
	fx := 0.0
	var pre []float64
	ex := make([][]int, nl.T)
	for e, ts := range nl.tok {
		for _, i := range ts {
			ex[i] = append(ex[i], e)
		}
	}
	for range iters {
		for e := range E {
			m := math.Inf(-1)
			for b := range N {
				m = max(m, th[e*N+b])
			}
			for b := range N {
				x[e*N+b] = math.Exp(th[e*N+b] - m)
			}
		}
		for range 30 {
			for e := range E {
				s := 0.0
				for b := range N {
					s += x[e*N+b]
				}
				for b := range N {
					x[e*N+b] /= s
				}
			}
			for b := range N {
				c := 0.0
				for e := range E {
					c += nl.load[e] * x[e*N+b]
				}
				f := nl.mean / c
				for e := range E {
					x[e*N+b] *= f
				}
			}
		}
		// The gradient of Σ_t w_t Σ_{B≠home} (1 − Π_{e∈t} (1 − x_eB)):
		// leave-one-out products, by token.
		clear(g)
		fx = 0
		for i, es := range ex {
			pre = slices.Grow(pre[:0], len(es))[:len(es)]
			for b := range N {
				if b == nl.home[i] {
					continue
				}
				p := 1.0
				for j, e := range es {
					pre[j] = p
					p *= 1 - x[e*N+b]
				}
				fx += nl.w[i] * (1 - p)
				s := 1.0
				for j := len(es) - 1; j >= 0; j-- {
					e := es[j]
					g[e*N+b] += nl.w[i] * pre[j] * s
					s *= 1 - x[e*N+b]
				}
			}
		}
		for e := range E {
			for b := range N {
				th[e*N+b] = math.Log(max(x[e*N+b], 1e-300))
				if nl.load[e] > 0 {
					th[e*N+b] -= eta * g[e*N+b] / nl.load[e]
				}
			}
		}
	}
	type share struct {
		e, b int
		v    float64
	}
	sh := make([]share, 0, E*N)
	for e := range E {
		for b := range N {
			sh = append(sh, share{e, b, x[e*N+b]})
		}
	}
	slices.SortStableFunc(sh, func(p, q share) int { return cmp.Compare(q.v, p.v) })
	start := slices.Repeat([]int{-1}, E)
	per := make([]int, N)
	for _, s := range sh {
		if start[s.e] < 0 && per[s.b] < E/N {
			start[s.e] = s.b
			per[s.b]++
		}
	}
	return start, fx
}

// runNodeCeiling is the node-ceiling experiment: nodeLayer.anneal from
// EPLB's nodes (first copies) under caps of 1.01, 1.02, 1.10 and no cap,
// against EPLB's count with the same copies. Loose caps show what balance
// costs.
func runNodeCeiling(_ context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("node-ceiling", stderr).withLayers(0, 1, 2).withLimit(20*time.Second, "each annealing's time")
	if err := f.parse(args); err != nil {
		return err
	}
	st, err := f.stats()
	if err != nil {
		return err
	}
	layers, err := nodeLayers(st, f.nodes, f.layers)
	if err != nil {
		return err
	}
	for _, nl := range layers {
		for _, capf := range []float64{1.01, 1.02, 1.10, math.Inf(1)} {
			r0, best, imb := nl.anneal(nl.eplb, capf, f.limit)
			fmt.Fprintf(stdout, "layer %d cap %.2f: EPLB %.4f → %.4f remote nodes per token (%+.2f%%), node busiest/mean %.4f\n", nl.l, capf, r0/nl.tokens, best/nl.tokens, (best/r0-1)*100, imb)
		}
	}
	return nil
}

// runRelaxNode is the relax-node experiment: whether a different method
// finds a better node placement than the annealing at cap 1.02:
// nodeLayer.relax, rounded, then annealed for what is left of the limit,
// against the annealing from EPLB for all of it.
func runRelaxNode(_ context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("relax-node", stderr).withLayers(0, 1, 2).withLimit(10*time.Second, "each method's time")
	iters := f.fs.Int("iters", 400, "mirror-descent iterations of the relaxation")
	eta := f.fs.Float64("eta", 1, "the mirror-descent step, relative to each expert's load")
	if err := f.parse(args); err != nil {
		return err
	}
	if *iters < 0 || !(*eta >= 0) || math.IsInf(*eta, 1) {
		return usageError{fmt.Errorf("-iters %d -eta %v: need -iters 0 or more and a finite -eta, 0 or more", *iters, *eta)}
	}
	st, err := f.stats()
	if err != nil {
		return err
	}
	layers, err := nodeLayers(st, f.nodes, f.layers)
	if err != nil {
		return err
	}
	lim := f.limit
	for _, nl := range layers {
		r0, b0, _ := nl.anneal(nl.eplb, 1.02, lim)
		begin := time.Now()
		start, fx := nl.relax(*iters, *eta)
		rt := time.Since(begin)
		_, rs, _ := nl.anneal(start, math.Inf(1), 0)
		_, b1, _ := nl.anneal(start, 1.02, max(lim-rt, time.Second))
		fmt.Fprintf(stdout, "layer %d: EPLB %.4f; anneal from EPLB %.4f (%+.2f%%); relaxed %.4f, rounded %.4f, after %.1fs + anneal %.4f (%+.2f%%)\n", nl.l, r0/nl.tokens, b0/nl.tokens, (b0/r0-1)*100, fx/nl.tokens, rs/nl.tokens, rt.Seconds(), b1/nl.tokens, (b1/r0-1)*100)
	}
	return nil
}
