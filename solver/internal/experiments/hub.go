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
	N, T, E := nl.N, nl.T, len(node)
	G := N * P
	// rl[e*G+h]: expert e's tokens from source h.
	rl := make([]float64, E*G)
	for e := range E {
		for _, i := range nl.tok[e] {
			rl[e*G+nl.rank[i]] += nl.w[i]
		}
	}
	// onNode is node n's GPU whose source uses e most, where a copy of
	// e on n goes.
	onNode := func(e, n int) int {
		g := n * P
		for h := n * P; h < (n+1)*P; h++ {
			if rl[e*G+h] > rl[e*G+g] {
				g = h
			}
		}
		return g
	}
	copies := make([][]int, E) // GPUs
	for e, b := range node {
		copies[e] = []int{onNode(e, b)}
	}
	// f[e*G*N+h*N+n]: the share of e's tokens from h that go to node n.
	f := make([]float64, E*G*N)
	// fill folds placement.StaticSplit's per-copy shares into nodes.
	frac := make([]float64, G*G)
	gpus := make([]int32, 0, N)
	fill := func(e int, cs []int, out []float64) {
		gpus = gpus[:0]
		for _, g := range cs {
			gpus = append(gpus, int32(g))
		}
		n := len(gpus)
		placement.StaticSplit(gpus, G, frac)
		clear(out)
		for h := range G {
			for i, g := range gpus {
				out[h*N+int(g)/P] += frac[h*n+i]
			}
		}
	}
	for e := range E {
		fill(e, copies[e], f[e*G*N:(e+1)*G*N])
	}
	nload := make([]float64, N)
	loadOf := func(e int, fe []float64, sign float64) {
		for h := range G {
			for n := range N {
				nload[n] += sign * rl[e*G+h] * fe[h*N+n]
			}
		}
	}
	for e := range E {
		loadOf(e, f[e*G*N:(e+1)*G*N], 1)
	}
	rel := func() []float64 {
		out := make([]float64, N)
		for n, v := range nload {
			out[n] = math.Round(v/nl.mean*1000) / 1000
		}
		return out
	}
	before = rel()
	// exps[i]: pattern i's experts at this layer.
	exps := make([][]int32, T)
	for e := range E {
		for _, i := range nl.tok[e] {
			exps[i] = append(exps[i], int32(e))
		}
	}
	// tokRemote is pattern i's expected remote nodes, with alt as e's
	// shares when alt != nil.
	tokRemote := func(i, alt int, fa []float64) float64 {
		h := nl.rank[i]
		H := h / P
		r := 0.0
		for n := range N {
			if n == H {
				continue
			}
			miss := 1.0
			for _, e32 := range exps[i] {
				e := int(e32)
				fe := f[e*G*N:]
				if e == alt {
					fe = fa
				}
				miss *= 1 - fe[h*N+n]
			}
			r += 1 - miss
		}
		return r * nl.w[i]
	}
	for i := range T {
		remote += tokRemote(i, -1, nil)
	}
	over := func(ld []float64) float64 {
		o := 0.0
		for _, v := range ld {
			o += max(0, v-capf*nl.mean)
		}
		return o
	}
	free := make([]int, N)
	for n := range free {
		free[n] = slots
	}
	fa := make([]float64, G*N)
	for over(nload) > 0 {
		o0 := over(nload)
		bestScore, bestE, bestG, bestD := math.Inf(1), -1, -1, 0.0
		for e := range E {
			for n := range N {
				if free[n] == 0 || slices.ContainsFunc(copies[e], func(g int) bool { return g/P == n }) {
					continue
				}
				g := onNode(e, n)
				cs := append(slices.Clone(copies[e]), g)
				fill(e, cs, fa)
				loadOf(e, f[e*G*N:(e+1)*G*N], -1)
				loadOf(e, fa, 1)
				o1 := over(nload)
				loadOf(e, fa, -1)
				loadOf(e, f[e*G*N:(e+1)*G*N], 1)
				if o1 >= o0-1e-9 {
					continue
				}
				d := 0.0
				for _, i := range nl.tok[e] {
					d += tokRemote(int(i), e, fa) - tokRemote(int(i), -1, nil)
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
		loadOf(e, f[e*G*N:(e+1)*G*N], -1)
		copies[e] = append(copies[e], bestG)
		fill(e, copies[e], f[e*G*N:(e+1)*G*N])
		loadOf(e, f[e*G*N:(e+1)*G*N], 1)
		free[bestG/P]--
		remote += bestD
		added++
	}
	for _, v := range nload {
		imb = max(imb, v/nl.mean)
	}
	return remote, imb, added, before, rel()
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
