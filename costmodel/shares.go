package costmodel

import (
	"fmt"
	"slices"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// shares is one layer plan as even-split weights: expert e sends the
// fraction cw[i] of its tokens to GPU cg[i] for i in [cs[e], cs[e+1]), and
// nw[i] to node nb[i] for i in [ns[e], ns[e+1]).
type shares struct {
	cs, ns []int32
	cg, nb []int32
	cw, nw []float64
	cm     []int32 // slots behind each cg entry
	cnt    []int32
	tmp    []int32
	slots  []float64
	// With a per-source dispatch (local, static), hw[cs[e]·G + h·n + i]
	// (n = cs[e+1]−cs[e]) is the fraction of expert e's tokens from source
	// GPU h that go to GPU cg[cs[e]+i]; hnw likewise per node entry.
	perSource bool
	hw, hnw   []float64
	// unit: every expert has one copy that takes all its tokens, so a
	// token's destinations are certain (probabilities 1).
	unit bool
	// hunit: a per-source split that sends every source's tokens of an
	// expert to one GPU (a dealt table, local with one copy per node):
	// hg[e·G+h] is that GPU and hb[e·G+h] its node, so a sourced token's
	// destinations are certain too.
	hunit  bool
	hg, hb []int32
}

// build fills s for layer l's plan lp (E experts, G GPUs in nodes of P)
// under dispatch d, splitting per source by sp (bound to the plan lp is a
// layer of). It reports whether every split is exact (Splitter.Split).
func (s *shares) build(l int, lp placement.LayerPlan, E, G, P int, d placement.Dispatch, sp Splitter) (exact bool, err error) {
	exact = true
	s.hunit = false
	if len(lp.SlotExpert) != len(lp.SlotGPU) {
		return false, fmt.Errorf("%d slot experts but %d slot GPUs", len(lp.SlotExpert), len(lp.SlotGPU))
	}
	if err := s.bucket(lp, E, G, P); err != nil {
		return false, err
	}
	_, hashed := sp.(*hashSplit)
	s.perSource = d.PerSource() || hashed
	s.unit = !s.perSource && len(s.cg) == E
	for i := 0; s.unit && i < len(s.cg); i++ {
		s.unit = s.cw[i] == 1 && s.nw[i] == 1
	}
	if !s.perSource {
		return true, nil
	}
	if lp.SlotShare != nil {
		return false, fmt.Errorf("the plan carries slot shares (a chosen split), but %s dispatch decides the split itself; use dispatch even, or a plan without slot_share", d)
	}
	s.hw = resizeF(s.hw, G*len(s.cg))
	s.hnw = resizeF(s.hnw, G*len(s.nb))
	for e := 0; e < E; e++ {
		a, b := int(s.cs[e]), int(s.cs[e+1])
		n := b - a
		frac := s.hw[a*G : b*G]
		if !sp.Split(l, e, s.cg[a:b], s.cm[a:b], frac) {
			exact = false
		}
		na, nb := int(s.ns[e]), int(s.ns[e+1])
		nn := nb - na
		nf := s.hnw[na*G : nb*G]
		for i := 0; i < n; i++ {
			node := s.cg[a+i] / int32(P)
			j := 0
			for s.nb[na+j] != node {
				j++
			}
			for h := 0; h < G; h++ {
				nf[h*nn+j] += frac[h*n+i]
			}
		}
	}
	s.fillUnit(E, G, P)
	return exact, nil
}

// fillUnit sets hunit, hg and hb when every (expert, source) split of a
// per-source s sends all the tokens to one GPU.
func (s *shares) fillUnit(E, G, P int) {
	s.hunit = true
	s.hg, s.hb = resize(s.hg, E*G), resize(s.hb, E*G)
	for e := 0; e < E && s.hunit; e++ {
		a, b := int(s.cs[e]), int(s.cs[e+1])
		n := b - a
		for h := 0; h < G && s.hunit; h++ {
			w := s.hw[a*G+h*n : a*G+(h+1)*n]
			one := -1
			for i, x := range w {
				switch {
				case x == 1 && one < 0:
					one = i
				case x != 0:
					s.hunit = false
				}
			}
			if one < 0 {
				s.hunit = false
				break
			}
			g := s.cg[a+one]
			s.hg[e*G+h], s.hb[e*G+h] = g, g/int32(P)
		}
	}
}

// bucket fills the even-split weights of lp: every expert's distinct GPUs
// (ascending) and nodes with their shares of its slots.
func (s *shares) bucket(lp placement.LayerPlan, E, G, P int) error {
	if len(lp.SlotExpert) != len(lp.SlotGPU) {
		return fmt.Errorf("%d slot experts but %d slot GPUs", len(lp.SlotExpert), len(lp.SlotGPU))
	}
	s.cnt = resize(s.cnt, E+1)
	s.slots = resizeF(s.slots, G)
	for i, e := range lp.SlotExpert {
		g := lp.SlotGPU[i]
		if e < 0 || int(e) >= E {
			return fmt.Errorf("slot %d: expert %d out of range [0,%d)", i, e, E)
		}
		if g < 0 || int(g) >= G {
			return fmt.Errorf("slot %d: GPU %d out of range [0,%d)", i, g, G)
		}
		s.cnt[e+1]++
		s.slots[g]++
	}
	for e := 0; e < E; e++ {
		if s.cnt[e+1] == 0 {
			return fmt.Errorf("expert %d has no slot", e)
		}
		s.cnt[e+1] += s.cnt[e]
	}
	if lp.SlotShare != nil && len(lp.SlotShare) != len(lp.SlotExpert) {
		return fmt.Errorf("%d slot shares for %d slots", len(lp.SlotShare), len(lp.SlotExpert))
	}
	// Bucket the slots by expert (cnt becomes the bucket ends).
	S := len(lp.SlotExpert)
	s.tmp = resize(s.tmp, S)
	for i, e := range lp.SlotExpert {
		s.tmp[s.cnt[e]] = int32(i)
		s.cnt[e]++
	}
	s.cs, s.ns = resize(s.cs, E+1), resize(s.ns, E+1)
	s.cg, s.cw, s.cm = s.cg[:0], s.cw[:0], s.cm[:0]
	s.nb, s.nw = s.nb[:0], s.nw[:0]
	lo := int32(0)
	for e := 0; e < E; e++ {
		hi := s.cnt[e]
		seg := s.tmp[lo:hi] // slot indices of expert e
		gpu := func(k int) int32 { return int32(lp.SlotGPU[seg[k]]) }
		for i := 1; i < len(seg); i++ { // insertion sort by GPU: few copies
			for j := i; j > 0 && gpu(j) < gpu(j-1); j-- {
				seg[j], seg[j-1] = seg[j-1], seg[j]
			}
		}
		s.cs[e] = int32(len(s.cg))
		s.ns[e] = int32(len(s.nb))
		for i := range seg {
			g := gpu(i)
			// Even split unless the plan gives each slot its share.
			w := 1 / float64(len(seg))
			if lp.SlotShare != nil {
				w = lp.SlotShare[seg[i]]
			}
			if i > 0 && g == gpu(i-1) {
				s.cw[len(s.cw)-1] += w
				s.cm[len(s.cm)-1]++
			} else {
				s.cg = append(s.cg, g)
				s.cw = append(s.cw, w)
				s.cm = append(s.cm, 1)
			}
			b := g / int32(P)
			if len(s.nb) > int(s.ns[e]) && s.nb[len(s.nb)-1] == b {
				s.nw[len(s.nw)-1] += w
			} else {
				s.nb = append(s.nb, b)
				s.nw = append(s.nw, w)
			}
		}
		lo = hi
	}
	s.cs[E] = int32(len(s.cg))
	s.ns[E] = int32(len(s.nb))
	return nil
}

// SourceShares returns, per layer, the share of each expert's tokens that
// each GPU sources, at [l][h·E+e], as Evaluate counts them under the
// per-source dispatches (static, local): from st's per-token patterns,
// a pattern without a source counting 1/G for every GPU. It returns nil
// when no pattern has a source (every GPU then sources the same share),
// or when a source is G or more (Evaluate refuses those stats).
func SourceShares(st *routing.Stats, G int) [][]float64 { return sourceFractions(st, G) }

// LayerSourceShares is SourceShares for layer l alone ([h·E+e]; nil when
// SourceShares is nil).
func LayerSourceShares(st *routing.Stats, G, l int) []float64 {
	if !sharesDefined(st, G) || l < 0 || l >= st.Layers {
		return nil
	}
	return layerShares(st, G, l, make([]float64, st.Experts))
}

// sharesDefined reports whether st has exact per-source loads for at
// most G sources, or per-token patterns with a source, every source below
// G.
func sharesDefined(st *routing.Stats, G int) bool {
	if st == nil || G <= 0 {
		return false
	}
	if exactSources(st, G) {
		return true
	}
	any := false
	for i := range st.Patterns {
		switch src := int(st.Patterns[i].Source); {
		case src >= G:
			return false
		case src >= 0:
			any = true
		}
	}
	return any
}

// sourceFractions returns per layer the share of each expert's tokens
// sourced on each GPU, [L][h·E+e], from patterns with a source (patterns
// without one count evenly for every GPU); nil when no pattern has a
// source, meaning uniform, or when one is G or more.
func sourceFractions(st *routing.Stats, G int) [][]float64 {
	if !sharesDefined(st, G) {
		return nil
	}
	out := make([][]float64, st.Layers)
	forLayers(st.Layers, workersFor(len(st.Patterns)*st.Layers), func() func(l int) {
		tot := make([]float64, st.Experts)
		return func(l int) { out[l] = layerShares(st, G, l, tot) }
	})
	return out
}

// exactSources reports whether st's SourceLoad (exact counts per source
// rank, every token counted) fits G GPUs.
func exactSources(st *routing.Stats, G int) bool {
	return len(st.SourceLoad) > 0 && len(st.SourceLoad) <= G && len(st.Load) == st.Layers
}

// layerShares is sourceFractions' layer l, with tot (len E) as scratch:
// from the exact per-source loads when st has them (a token without a
// source counting 1/G for every GPU), else from the patterns (a sample of
// the paths on long traces).
func layerShares(st *routing.Stats, G, l int, tot []float64) []float64 {
	E, k := st.Experts, st.TopK
	f := make([]float64, G*E)
	if exactSources(st, G) {
		for e := 0; e < E; e++ {
			load := st.Load[l][e]
			if load <= 0 {
				for h := 0; h < G; h++ {
					f[h*E+e] = 1 / float64(G)
				}
				continue
			}
			known := 0.0
			for h, sl := range st.SourceLoad {
				f[h*E+e] = sl[l][e]
				known += sl[l][e]
			}
			rest := max(0, load-known) / float64(G)
			for h := 0; h < G; h++ {
				f[h*E+e] = (f[h*E+e] + rest) / load
			}
		}
		return f
	}
	clear(tot)
	for i := range st.Patterns {
		pt := &st.Patterns[i]
		for _, e := range pt.Experts[l*k : (l+1)*k] {
			tot[e] += pt.Count
			if pt.Source >= 0 {
				f[int(pt.Source)*E+int(e)] += pt.Count
			} else {
				for h := 0; h < G; h++ {
					f[h*E+int(e)] += pt.Count / float64(G)
				}
			}
		}
	}
	for h := 0; h < G; h++ {
		for e := 0; e < E; e++ {
			if tot[e] > 0 {
				f[h*E+e] /= tot[e]
			} else {
				f[h*E+e] = 1 / float64(G)
			}
		}
	}
	return f
}

func resize(x []int32, n int) []int32 {
	if cap(x) < n {
		return make([]int32, n)
	}
	x = x[:n]
	clear(x)
	return x
}

func resizeF(x []float64, n int) []float64 {
	if cap(x) < n {
		return make([]float64, n)
	}
	x = x[:n]
	clear(x)
	return x
}

// probBuf computes one token's destination probabilities: p_g for the GPUs
// in g (others 0) and q_B for the nodes in b.
type probBuf struct {
	prod, nprod   []float64
	stamp, nstamp []uint32
	gen           uint32
	g, b          []int32
	p, q          []float64
}

func (pb *probBuf) init(G, N int) {
	pb.prod = make([]float64, G)
	pb.nprod = make([]float64, N)
	pb.stamp = make([]uint32, G)
	pb.nstamp = make([]uint32, N)
}

// compute fills pb for a token whose layer experts are ex under shares sh.
func (pb *probBuf) compute(ex []int16, sh *shares) { pb.computeFrom(ex, sh, -1, 0) }

// computeFrom is compute for a token sourced on GPU h under a per-source
// dispatch (sh.perSource, G GPUs); h < 0 uses the source-free split.
func (pb *probBuf) computeFrom(ex []int16, sh *shares, h, G int) {
	if sh.unit {
		// Certain destinations: the distinct GPUs and nodes of ex, each
		// with probability exactly 1 (as the products below would give).
		pb.g, pb.b, pb.p, pb.q = pb.g[:0], pb.b[:0], pb.p[:0], pb.q[:0]
		for _, e := range ex {
			if g := sh.cg[sh.cs[e]]; !slices.Contains(pb.g, g) {
				pb.g = append(pb.g, g)
				pb.p = append(pb.p, 1)
			}
			if b := sh.nb[sh.ns[e]]; !slices.Contains(pb.b, b) {
				pb.b = append(pb.b, b)
				pb.q = append(pb.q, 1)
			}
		}
		return
	}
	if h >= 0 && sh.hunit {
		// Certain destinations per source: the same sets and
		// probabilities exactly 1, as the products below would give.
		pb.g, pb.b, pb.p, pb.q = pb.g[:0], pb.b[:0], pb.p[:0], pb.q[:0]
		for _, e := range ex {
			k := int(e)*G + h
			if g := sh.hg[k]; !slices.Contains(pb.g, g) {
				pb.g = append(pb.g, g)
				pb.p = append(pb.p, 1)
			}
			if b := sh.hb[k]; !slices.Contains(pb.b, b) {
				pb.b = append(pb.b, b)
				pb.q = append(pb.q, 1)
			}
		}
		return
	}
	pb.gen++
	if pb.gen == 0 {
		clear(pb.stamp)
		clear(pb.nstamp)
		pb.gen = 1
	}
	pb.g, pb.b = pb.g[:0], pb.b[:0]
	for _, e := range ex {
		a, b := int(sh.cs[e]), int(sh.cs[e+1])
		n := b - a
		w := sh.cw[a:b]
		if h >= 0 {
			w = sh.hw[a*G+h*n : a*G+(h+1)*n]
		}
		for i := a; i < b; i++ {
			g := sh.cg[i]
			if pb.stamp[g] != pb.gen {
				pb.stamp[g] = pb.gen
				pb.prod[g] = 1
				pb.g = append(pb.g, g)
			}
			pb.prod[g] *= 1 - w[i-a]
		}
		na, nb := int(sh.ns[e]), int(sh.ns[e+1])
		nn := nb - na
		nw := sh.nw[na:nb]
		if h >= 0 {
			nw = sh.hnw[na*G+h*nn : na*G+(h+1)*nn]
		}
		for i := na; i < nb; i++ {
			bn := sh.nb[i]
			if pb.nstamp[bn] != pb.gen {
				pb.nstamp[bn] = pb.gen
				pb.nprod[bn] = 1
				pb.b = append(pb.b, bn)
			}
			pb.nprod[bn] *= 1 - nw[i-na]
		}
	}
	pb.p = pb.p[:0]
	for _, g := range pb.g {
		pb.p = append(pb.p, 1-pb.prod[g])
	}
	pb.q = pb.q[:0]
	for _, b := range pb.b {
		pb.q = append(pb.q, 1-pb.nprod[b])
	}
}
