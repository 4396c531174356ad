package onenode

import (
	"math"
	"slices"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// Cost returns, for the single-copy problems LowerBound covers (the
// caller makes sure plans have one copy per expert), a layer's exact
// modeled time as a function of its busiest GPU's routed tokens maxL and
// its busiest GPU's distinct tokens maxD; ok is false for other problems.
func Cost(sc costmodel.Scenario) (cost func(maxL, maxD float64) float64, ok bool) {
	s, c := sc.Stats, sc.Cluster
	if sc.Flow != costmodel.FlowHome || c.Nodes != 1 || s.Patterns == nil || sc.Dispatch != placement.DispatchEven {
		return nil, false
	}
	G, E := c.GPUs(), s.Experts
	if E%G != 0 {
		return nil, false
	}
	for g := 1; g < G; g++ {
		if c.SpeedOf(g) != c.SpeedOf(0) {
			return nil, false
		}
	}
	for i := range s.Patterns {
		if s.Patterns[i].Source >= 0 {
			return nil, false
		}
	}
	m := E / G
	terms := sc.Terms()
	tb := sc.Model.TokenBytes()
	bw := c.NVLinkBytesPerSec()
	lat := c.NVLinkLatency.Seconds()
	return func(maxL, maxD float64) float64 {
		tail := terms.Compute(0, maxL, float64(m))
		bytes := float64(G-1) / float64(G) * maxD * tb
		comm := 0.0
		if bytes > 0 && G > 1 {
			comm = 2 * (bytes/bw + lat)
		}
		return terms.LayerSec(tail, comm, 0)
	}, true
}

// LowerBound is a lower bound, on the exact cost model, on the modeled
// time of every single-copy plan with E/G experts per GPU, for the home
// flow on one node with per-token patterns whose home GPU is unknown
// (spread evenly) and GPUs of equal speed; ok is false otherwise. Per
// layer:
//
//   - compute tail ≥ the mean GPU's compute (Σ load·perToken + E·perExpert)/G;
//   - a token whose k distinct experts sit on m GPUs has m ≥ k − (pairs of
//     its experts sharing a GPU), so Σ_g D_g (D_g: tokens reaching GPU g)
//     ≥ Σ_t k_t − W, where W, the co-activation weight inside GPUs, is at
//     most ½ Σ_e (its E/G − 1 largest co-activations);
//   - dispatch: GPU g receives (G−1)/G·D_g tokens, so the busiest port
//     carries at least (G−1)/G² · Σ_g D_g token copies; combine mirrors it;
//
// and the layer time is monotone in the three (sequential or overlapped).
//
// With corners (certified per layer by Bottleneck), each layer costs at
// least the smallest Cost over its corners, each raised to the counting
// bounds; nil corners give the counting bounds alone.
func LowerBound(sc costmodel.Scenario, corners [][]Corner) (float64, bool) {
	cost, ok := Cost(sc)
	if !ok {
		return 0, false
	}
	s, c := sc.Stats, sc.Cluster
	G, E, L, k := c.GPUs(), s.Experts, s.Layers, s.TopK
	m := E / G
	total, tokens := 0.0, 0.0
	for i := range s.Patterns {
		tokens += s.Patterns[i].Count
	}
	co := make([]float64, E*E)
	row := make([]float64, E)
	for l := 0; l < L; l++ {
		load := 0.0
		for _, x := range s.Load[l] {
			load += x
		}
		// Σ_t k_t and the co-activations of the layer.
		clear(co)
		kt := 0.0
		for i := range s.Patterns {
			pt := &s.Patterns[i]
			ex := pt.Experts[l*k : (l+1)*k]
			distinct := 0
			for a := range ex {
				dup := false
				for b := 0; b < a; b++ {
					if ex[b] == ex[a] {
						dup = true
						break
					}
				}
				if dup {
					continue
				}
				distinct++
				for b := 0; b < a; b++ {
					if ex[b] != ex[a] && !slices.Contains(ex[:b], ex[b]) {
						co[int(ex[a])*E+int(ex[b])] += pt.Count
						co[int(ex[b])*E+int(ex[a])] += pt.Count
					}
				}
			}
			kt += float64(distinct) * pt.Count
		}
		W := 0.0
		for e := 0; e < E; e++ {
			copy(row, co[e*E:(e+1)*E])
			slices.Sort(row)
			for _, v := range row[E-(m-1):] {
				W += v / 2
			}
		}
		// Σ_t m_t ≥ number of tokens too (every token reaches a GPU), and
		// the busiest GPU reaches at least the mean.
		maxD := math.Max(kt-W, tokens) / float64(G)
		meanL := load / float64(G)
		if l >= len(corners) || len(corners[l]) == 0 {
			total += cost(meanL, maxD)
			continue
		}
		best := math.Inf(1)
		for _, c := range corners[l] {
			best = math.Min(best, cost(math.Max(meanL, c.L), math.Max(maxD, c.D)))
		}
		total += best
	}
	return total, true
}
