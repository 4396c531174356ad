package trafficbound

// A config is one way a token's experts can lie on the nodes, reduced to
// what the bound needs: its cost (remote nodes in the home flow, the
// transition count in the chain flow) and its moments f, the quantities
// whose totals over all tokens the masters bound from above.
type config struct {
	cost float64
	f    []float64
}

// homeConfigs lists the configurations of a token with k distinct experts
// whose source is on node A, for N nodes: nA experts on A and the other
// k−nA in at most N−1 blocks on other nodes (a partition of k−nA). Its
// cost is the number of blocks (remote nodes used); its moments are
// f[0] = nA (experts served at home) and f[1] = Π, the pairs of its experts
// on a common node, C(nA,2) + Σ C(block,2). With N = 1 only nA = k exists.
//
// Every placement puts every token in one of these configurations (for a
// single-copy placement, or for each realization of the dispatch's random
// choice among copies), which is what makes the bound valid.
func homeConfigs(k, N int) []config {
	var out []config
	for nA := k; nA >= 0; nA-- {
		home := float64(nA * (nA - 1) / 2)
		partitions(k-nA, N-1, func(parts []int) {
			pi := home
			for _, p := range parts {
				pi += float64(p * (p - 1) / 2)
			}
			out = append(out, config{cost: float64(len(parts)), f: []float64{float64(nA), pi}})
		})
	}
	return out
}

// chainConfigs lists the configurations of a token with k1 distinct
// experts at layer l−1 and k2 at layer l, on N nodes of P GPUs: at l−1 a
// partition into n1 ≤ N node blocks b of s_b experts on d_b ≤ min(s_b, P)
// distinct GPUs, at l a partition p2 into n2 ≤ N node blocks, and a set
// M of l−1 blocks sharing their node with a block of l (|M| = j, n1 + n2
// − j ≤ N). Its cost Σ_b d_b·(n2 − [b ∈ M]) is the token's cross-node
// transitions (every GPU used at l−1 sends to every node used at l but
// its own). Moments: f[0] = Π1 and f[1] = Π2, the pairs on a common node
// at each layer, f[2] = Πg, the pairs on a common GPU at l−1, and f[3] =
// X, the cross-layer pairs (e1 at l−1, e2 at l) on a common node. For
// each choice only the least moments are kept (a balanced split of each
// block over its d_b GPUs, M's partners the smallest blocks of p2 in
// reverse order): a configuration with the same cost and larger moments
// never lowers the bound. Duplicates are dropped.
func chainConfigs(k1, k2, N, P int) []config {
	type key struct{ cost, pi1, pi2, pig, x float64 }
	seen := map[key]bool{}
	var out []config
	add := func(k key) {
		if !seen[k] {
			seen[k] = true
			out = append(out, config{cost: k.cost, f: []float64{k.pi1, k.pi2, k.pig, k.x}})
		}
	}
	var p2s [][]int
	partitions(k2, N, func(p []int) { p2s = append(p2s, append([]int(nil), p...)) })
	partitions(k1, N, func(p []int) {
		a := append([]int(nil), p...)
		n1 := len(a)
		pi1 := 0.0
		for _, s := range a {
			pi1 += float64(s * (s - 1) / 2)
		}
		d := make([]int, n1)
		var splits func(i int, pig float64)
		splits = func(i int, pig float64) {
			if i < n1 {
				for v := 1; v <= min(a[i], P); v++ {
					d[i] = v
					splits(i+1, pig+float64(balancedPairs(a[i], v)))
				}
				return
			}
			for _, p2 := range p2s {
				n2 := len(p2)
				pi2 := 0.0
				for _, s := range p2 {
					pi2 += float64(s * (s - 1) / 2)
				}
				for set := 0; set < 1<<n1; set++ {
					j := bitsOn(set)
					if j > n2 || n1+n2-j > N {
						continue
					}
					cost := 0
					var sizes []int
					for b := range n1 {
						cost += d[b] * n2
						if set>>b&1 == 1 {
							cost -= d[b]
							sizes = append(sizes, a[b])
						}
					}
					// Least X: the matched blocks (decreasing) with the j
					// smallest blocks of p2 in increasing order.
					x := 0
					for i, s := range sizes {
						x += s * p2[n2-1-i]
					}
					add(key{float64(cost), pi1, pi2, pig, float64(x)})
				}
			}
		}
		splits(0, 0)
	})
	return out
}

// balancedPairs is the least Σ C(part, 2) over splits of s into exactly
// d positive parts (as equal as possible).
func balancedPairs(s, d int) int {
	q, r := s/d, s%d
	return r*(q+1)*q/2 + (d-r)*q*(q-1)/2
}

func bitsOn(x int) int {
	n := 0
	for ; x > 0; x &= x - 1 {
		n++
	}
	return n
}

// partitions calls fn with every partition of n into at most maxParts
// positive parts, in decreasing order (one call with no parts for n = 0).
// fn must not keep the slice.
func partitions(n, maxParts int, fn func([]int)) {
	parts := make([]int, 0, n)
	var rec func(left, largest int)
	rec = func(left, largest int) {
		if left == 0 {
			fn(parts)
			return
		}
		if len(parts) == maxParts {
			return
		}
		for p := min(left, largest); p >= 1; p-- {
			parts = append(parts, p)
			rec(left-p, p)
			parts = parts[:len(parts)-1]
		}
	}
	rec(n, n)
}
