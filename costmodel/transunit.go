package costmodel

import "math/bits"

// transUnit is transMasses for patterns when every expert of both layers
// has one copy that takes all its tokens (shares.unit) on at most 64
// GPUs: a token's partial results are certainly on the GPUs of its
// layer-(l−1) experts and certainly needed on those of its layer-l
// experts and their nodes, so each pair adds its count once, found from
// bit masks of the GPUs and nodes. Every mass gets the same additions in
// the same order as through addTransPattern (one per pattern, of the
// pattern's count), so the sums are the same to the bit.
func (ev *engine) transUnit(l int, prev, cur *shares, ms *massSet) {
	G, N, P, k, E := ev.g, ev.n, ev.p, ev.k, ev.e
	pg, cg := make([]int8, E), make([]int8, E)
	for e := 0; e < E; e++ {
		pg[e], cg[e] = int8(prev.cg[prev.cs[e]]), int8(cur.cg[cur.cs[e]])
	}
	for i := range ev.stats.Patterns {
		pt := &ev.stats.Patterns[i]
		c := pt.Count
		if c == 0 {
			continue
		}
		var S, R, B uint64
		for _, e := range pt.Experts[(l-1)*k : l*k] {
			S |= 1 << uint(pg[e])
		}
		for _, e := range pt.Experts[l*k : (l+1)*k] {
			g := uint(cg[e])
			R |= 1 << g
			B |= 1 << (g / uint(P))
		}
		for s := S; s != 0; s &= s - 1 {
			g1 := bits.TrailingZeros64(s)
			m := ms.mass[g1*G : (g1+1)*G]
			for r := R; r != 0; r &= r - 1 {
				m[bits.TrailingZeros64(r)] += c
			}
			nm := ms.nmass[g1*N : (g1+1)*N]
			for b := B; b != 0; b &= b - 1 {
				nm[bits.TrailingZeros64(b)] += c
			}
		}
	}
}
