package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/moetuner/moetuner/placement"
)

// hubCopies asks whether copies under static dispatch can pay for an
// unbalanced node placement: from node (one copy per expert, nodes of P
// GPUs), it adds up to slots copies per node, greedily, each the one that
// cuts the node overload above capf × the mean most per remote copy it
// adds (or saves), until no node is over. Sources split as SGLang's
// static dispatch in expectation: the own GPU's copy if any, else evenly.
// It returns the remote count and node busiest/mean after, and the node
// loads over the mean before and after.
func (nl *nodeLayer) hubCopies(node []int, P, slots int, capf float64) (remote, imb float64, added int, before, after []float64) {
	h := newHubState(nl, node, P, capf)
	N, E, G := h.N, h.E, h.G
	before = h.rel()
	for i := range nl.T {
		remote += h.tokRemote(i, -1, nil)
	}
	free := make([]int, N)
	for n := range free {
		free[n] = slots
	}
	fa := make([]float64, G*N)
	for h.over() > 0 {
		o0 := h.over()
		bestScore, bestE, bestG, bestD := math.Inf(1), -1, -1, 0.0
		for e := range E {
			for n := range N {
				if free[n] == 0 || slices.ContainsFunc(h.copies[e], func(g int) bool { return g/P == n }) {
					continue
				}
				g := h.onNode(e, n)
				cs := append(slices.Clone(h.copies[e]), g)
				h.fill(cs, fa)
				h.loadOf(e, h.fe(e), -1)
				h.loadOf(e, fa, 1)
				o1 := h.over()
				h.loadOf(e, fa, -1)
				h.loadOf(e, h.fe(e), 1)
				if o1 >= o0-1e-9 {
					continue
				}
				d := 0.0
				for _, i := range nl.tok[e] {
					d += h.tokRemote(int(i), e, fa) - h.tokRemote(int(i), -1, nil)
				}
				// remote added per unit of overload removed; savings rank first
				score := d / (o0 - o1)
				if score < bestScore {
					bestScore, bestE, bestG, bestD = score, e, g, d
				}
			}
		}
		if bestE < 0 {
			break
		}
		e := bestE
		h.loadOf(e, h.fe(e), -1)
		h.copies[e] = append(h.copies[e], bestG)
		h.fill(h.copies[e], h.fe(e))
		h.loadOf(e, h.fe(e), 1)
		free[bestG/P]--
		remote += bestD
		added++
	}
	for _, v := range h.nload {
		imb = max(imb, v/nl.mean)
	}
	return remote, imb, added, before, h.rel()
}

// hubState is hubCopies' state: the layer's token counts by expert and
// source GPU, each expert's copies and how static dispatch splits its
// tokens over nodes, and the node loads that follow.
type hubState struct {
	nl         *nodeLayer
	N, T, E, G int
	P          int
	capf       float64
	// rl[e*G+h]: expert e's tokens from source h.
	rl     []float64
	copies [][]int // GPUs
	// f[e*G*N+h*N+n]: the share of e's tokens from h that go to node n.
	f     []float64
	nload []float64
	// exps[i]: pattern i's experts at this layer.
	exps [][]int32
	// fill's buffers
	frac []float64
	gpus []int32
}

// newHubState starts hubCopies from one copy of each expert e on node
// node[e], on the GPU whose source uses it most.
func newHubState(nl *nodeLayer, node []int, P int, capf float64) *hubState {
	N, T, E := nl.N, nl.T, len(node)
	G := N * P
	h := &hubState{nl: nl, N: N, T: T, E: E, G: G, P: P, capf: capf}
	h.rl = make([]float64, E*G)
	for e := range E {
		for _, i := range nl.tok[e] {
			h.rl[e*G+nl.rank[i]] += nl.w[i]
		}
	}
	h.copies = make([][]int, E)
	for e, b := range node {
		h.copies[e] = []int{h.onNode(e, b)}
	}
	h.f = make([]float64, E*G*N)
	h.frac = make([]float64, G*G)
	h.gpus = make([]int32, 0, N)
	for e := range E {
		h.fill(h.copies[e], h.fe(e))
	}
	h.nload = make([]float64, N)
	for e := range E {
		h.loadOf(e, h.fe(e), 1)
	}
	h.exps = make([][]int32, T)
	for e := range E {
		for _, i := range nl.tok[e] {
			h.exps[i] = append(h.exps[i], int32(e))
		}
	}
	return h
}

// fe is expert e's shares in f.
func (h *hubState) fe(e int) []float64 {
	return h.f[e*h.G*h.N : (e+1)*h.G*h.N]
}

// onNode is node n's GPU whose source uses e most, where a copy of e on
// n goes.
func (h *hubState) onNode(e, n int) int {
	g := n * h.P
	for s := n * h.P; s < (n+1)*h.P; s++ {
		if h.rl[e*h.G+s] > h.rl[e*h.G+g] {
			g = s
		}
	}
	return g
}

// fill folds placement.StaticSplit's per-copy shares for copies cs into
// nodes, in out.
func (h *hubState) fill(cs []int, out []float64) {
	h.gpus = h.gpus[:0]
	for _, g := range cs {
		h.gpus = append(h.gpus, int32(g))
	}
	n := len(h.gpus)
	placement.StaticSplit(h.gpus, h.G, h.frac)
	clear(out)
	for s := range h.G {
		for i, g := range h.gpus {
			out[s*h.N+int(g)/h.P] += h.frac[s*n+i]
		}
	}
}

// loadOf adds sign times e's tokens, split by shares fe, to the node
// loads.
func (h *hubState) loadOf(e int, fe []float64, sign float64) {
	for s := range h.G {
		for n := range h.N {
			h.nload[n] += sign * h.rl[e*h.G+s] * fe[s*h.N+n]
		}
	}
}

// rel is the node loads over the mean, to 3 decimals.
func (h *hubState) rel() []float64 {
	out := make([]float64, h.N)
	for n, v := range h.nload {
		out[n] = math.Round(v/h.nl.mean*1000) / 1000
	}
	return out
}

// tokRemote is pattern i's expected remote nodes, with fa as alt's
// shares when fa != nil.
func (h *hubState) tokRemote(i, alt int, fa []float64) float64 {
	src := h.nl.rank[i]
	H := src / h.P
	r := 0.0
	for n := range h.N {
		if n == H {
			continue
		}
		miss := 1.0
		for _, e32 := range h.exps[i] {
			e := int(e32)
			fe := h.f[e*h.G*h.N:]
			if e == alt {
				fe = fa
			}
			miss *= 1 - fe[src*h.N+n]
		}
		r += 1 - miss
	}
	return r * h.nl.w[i]
}

// over is the node load above capf times the mean, summed over nodes.
func (h *hubState) over() float64 {
	o := 0.0
	for _, v := range h.nload {
		o += max(0, v-h.capf*h.nl.mean)
	}
	return o
}

// runHubCopies is the hub-copies experiment: anneal the node placement
// under looser caps, then let copies (8 per node, static dispatch) bring
// the nodes back under 1.02.
func runHubCopies(_ context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("hub-copies", stderr).withLayers(0, 1, 2).withLimit(20*time.Second, "each annealing's time")
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
		r1, _, _, _, _ := nl.hubCopies(nl.eplb, 8, 8, 1.02)
		fmt.Fprintf(stdout, "layer %d: EPLB nodes, static split: %.4f\n", nl.l, r1/nl.tokens)
		for _, capf := range []float64{1.02, 1.06, 1.10, 1.20, 1.40} {
			r0, best, imb, node := nl.annealPlan(nl.eplb, capf, f.limit)
			r, imb2, added, b0, b1 := nl.hubCopies(node, 8, 8, 1.02)
			fmt.Fprintf(stdout, "layer %d cap %.2f: node loads over the mean %v → %v\n", nl.l, capf, b0, b1)
			fmt.Fprintf(stdout, "layer %d cap %.2f: annealed %.4f (%+.2f%%, node b/m %.3f); with %d copies %.4f (%+.2f%% vs EPLB one copy, vs EPLB split %+.2f%%), node b/m %.3f\n",
				nl.l, capf, best/nl.tokens, (best/r0-1)*100, imb, added, r/nl.tokens, (r/r0-1)*100, (r/r1-1)*100, imb2)
		}
	}
	return nil
}
