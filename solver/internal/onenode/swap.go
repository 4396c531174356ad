package onenode

import (
	"math/bits"
	"slices"
)

// swapColumns is the pricing heuristic that starts from columns already in
// the LP's support (their π(S) is 1: reduced cost 0) and climbs by moves
// that drop up to two members and add up to two outsiders, keeping
// |S| ≤ m, N(S) ≤ z and the load cap, as long as π(S) rises. Columns the
// exhaustive search finds near the LP bound usually differ from a support
// column in two or three experts, so these climbs find most of them at a
// fraction of the search's cost. It returns the distinct groups reaching
// π(S) > 1, at most limit of them.
func (c *Layer) swapColumns(pi []float64, z int, seeds [][]int, limit int) [][]int {
	order := make([]int, 0, c.E)
	for e := 0; e < c.E; e++ {
		if pi[e] > 0 && c.load[e] <= z && c.fits(c.load[e]) {
			order = append(order, e)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case pi[a] > pi[b]:
			return -1
		case pi[a] < pi[b]:
			return 1
		}
		return a - b
	})
	var out [][]int
	seen := map[string]bool{}
	K := make([]uint64, c.W)
	in := make([]bool, c.E)
	// fit[i] caches whether order[i] fits next to the kept members: 0
	// unknown, 1 yes, 2 no (reset per removal).
	fit := make([]uint8, len(order))
	marg := make([]int, len(order)) // order[i]'s new tokens, where it fits
	sc := &swapClimb{c: c, pi: pi, z: z, order: order, K: K, fit: fit, marg: marg}
	for _, B := range seeds {
		S := slices.Clone(B)
		val := 0.0
		for _, e := range S {
			val += pi[e]
		}
		for {
			clear(in)
			for _, e := range S {
				in[e] = true
			}
			// The heaviest two outsiders bound what any move can add.
			top := [2]float64{}
			k := 0
			for _, e := range order {
				if !in[e] {
					top[k] = pi[e]
					if k++; k == 2 {
						break
					}
				}
			}
			// The best move over every removal of at most two members.
			bestGain, bestR, bestA := 1e-12, []int(nil), []int(nil)
			n := len(S)
			var R []int
			for r1 := -1; r1 < n; r1++ {
				for r2 := r1 + 1; r2 <= n; r2++ {
					// r1 = −1 removes nothing; r2 = n removes one at most.
					if r2 < n && r1 < 0 {
						continue // the single removals come with r1
					}
					R = R[:0]
					if r1 >= 0 {
						R = append(R, S[r1])
					}
					if r2 < n {
						R = append(R, S[r2])
					}
					add := min(2, c.m-(n-len(R)))
					if add <= 0 {
						continue
					}
					lost := 0.0
					for _, e := range R {
						lost += pi[e]
					}
					if top[0]+top[1]*float64(add-1)-lost <= bestGain {
						continue
					}
					bestGain, bestR, bestA = sc.moves(S, R, in, lost, add, bestGain, bestR, bestA)
				}
			}
			if bestA == nil {
				break
			}
			S = slices.DeleteFunc(S, func(e int) bool { return slices.Contains(bestR, e) })
			S = append(S, bestA...)
			val += bestGain
		}
		if val <= 1+1e-9 {
			continue
		}
		if k := groupKey(S); !seen[k] {
			seen[k] = true
			if out = append(out, S); len(out) >= limit {
				break
			}
		}
	}
	return out
}

// swapClimb is swapColumns's state for one π and bound z: the outsiders
// in decreasing π (order) and the scratch of a move's search.
type swapClimb struct {
	c     *Layer
	pi    []float64
	z     int
	order []int
	K     []uint64
	// fit[i] caches whether order[i] fits next to the kept members: 0
	// unknown, 1 yes, 2 no (reset per removal).
	fit  []uint8
	marg []int // order[i]'s new tokens, where it fits
}

// moves improves the best move so far (bestGain, removing bestR and
// adding bestA) by those that remove R from S (members in, R's π lost)
// and add one or, with add ≥ 2, two outsiders, and returns the best.
func (sc *swapClimb) moves(S, R []int, in []bool, lost float64, add int, bestGain float64, bestR, bestA []int) (float64, []int, []int) {
	c, pi, z, order, K, fit, marg := sc.c, sc.pi, sc.z, sc.order, sc.K, sc.fit, sc.marg
	clear(K)
	ld := 0
	for _, e := range S {
		if !slices.Contains(R, e) {
			ld += c.load[e]
			for w, x := range c.sets[e] {
				K[w] |= x
			}
		}
	}
	room := z - popcount(K)
	if room < 0 {
		return bestGain, bestR, bestA
	}
	clear(fit)
	fits := func(i int) bool {
		if fit[i] == 0 {
			e := order[i]
			fit[i] = 2
			if c.fits(ld + c.load[e]) {
				if m := c.marginalUpTo(e, K, room); m <= room {
					fit[i], marg[i] = 1, m
				}
			}
		}
		return fit[i] == 1
	}
	// One outsider: the heaviest that fits.
	for i, e := range order {
		if pi[e]-lost <= bestGain {
			break
		}
		if !in[e] && fits(i) {
			bestGain, bestR, bestA = pi[e]-lost, slices.Clone(R), []int{e}
			break
		}
	}
	if add < 2 {
		return bestGain, bestR, bestA
	}
	// Two outsiders, in decreasing π: the first b that fits
	// with a is the best partner of a.
	for i, a := range order {
		if pi[a]+pi[a]-lost <= bestGain {
			break
		}
		if in[a] || !fits(i) {
			continue
		}
		for j := i + 1; j < len(order); j++ {
			b := order[j]
			if pi[a]+pi[b]-lost <= bestGain {
				break
			}
			if in[b] || !fits(j) || !c.fits(ld+c.load[a]+c.load[b]) {
				continue
			}
			// Both fit alone; together they add at most the
			// sum of their new tokens.
			u := 0
			if marg[i]+marg[j] > room {
				sa, sb := c.sets[a], c.sets[b]
				for w := 0; w < len(K) && u <= room; w += 4 {
					for x := w; x < min(w+4, len(K)); x++ {
						u += bits.OnesCount64((sa[x] | sb[x]) &^ K[x])
					}
				}
			}
			if u <= room {
				bestGain, bestR, bestA = pi[a]+pi[b]-lost, slices.Clone(R), []int{a, b}
				break
			}
		}
	}
	return bestGain, bestR, bestA
}
