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
// experts at layer l−1 and k2 at layer l on N nodes: a partition p1 of k1
// into n1 ≤ N blocks, a partition p2 of k2 into n2 ≤ N blocks, and j
// blocks of p1 sharing their node with a block of p2 (n1+n2−j ≤ N). Its
// cost n1·n2 − j is a lower bound on the token's cross-node transitions
// (every GPU used at l−1 sends to every node used at l but its own, and a
// node used at l−1 has at least one such GPU). Moments: f[0] = Π1, f[1] =
// Π2 (pairs on a common node at each layer) and f[2] = X, the cross-layer
// pairs (e1 at l−1, e2 at l) on a common node, of which only the least
// for each (p1, p2, j) is kept: a configuration with the same cost and
// larger moments never lowers the bound.
func chainConfigs(k1, k2, N int) []config {
	var out []config
	partitions(k1, N, func(p1 []int) {
		a := append([]int(nil), p1...)
		partitions(k2, N, func(p2 []int) {
			n1, n2 := len(a), len(p2)
			pi1, pi2 := 0.0, 0.0
			for _, p := range a {
				pi1 += float64(p * (p - 1) / 2)
			}
			for _, p := range p2 {
				pi2 += float64(p * (p - 1) / 2)
			}
			for j := 0; j <= min(n1, n2); j++ {
				if n1+n2-j > N {
					continue
				}
				// Least Σ p1·p2 over j matched block pairs: the j smallest
				// blocks of each, largest with smallest (both lists are
				// sorted in decreasing order).
				x := 0.0
				for i := 0; i < j; i++ {
					x += float64(a[n1-j+i] * p2[n2-1-i])
				}
				out = append(out, config{cost: float64(n1*n2 - j), f: []float64{pi1, pi2, x}})
			}
		})
	})
	return out
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
