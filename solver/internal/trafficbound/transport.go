package trafficbound

import (
	"math"
	"slices"

	"github.com/moetuner/moetuner/internal/assign"
)

// maxAssign bounds from above max Σ_e val[e][x_e] over assignments x of
// every item e to one bin with at most caps[B] items in bin B (Σ caps ≥
// number of items). It solves the transportation problem exactly as an
// assignment of items to slots (the Hungarian method with potentials,
// bins expanded into caps[B] slots), then returns the value of the
// Lagrangian dual
//
//	Σ_e max_B (val[e][B] − π_B) + Σ_B π_B·caps[B],  π ≥ 0,
//
// at the bin potentials π of the assignment found, a bound for any π ≥ 0
// (weak duality) that equals the optimum when the assignment is optimal,
// so the certificate does not rest on the search. steps counts the
// Hungarian's inner scans.
func maxAssign(val [][]float64, caps []int) (bound float64, steps int) {
	N := len(caps)
	n := len(val)
	var slotBin []int
	for B, c := range caps {
		for range min(c, n) {
			slotBin = append(slotBin, B)
		}
	}
	m := len(slotBin)
	// Rows = items, columns = slots, min cost −val.
	rowOf, steps := assign.Min(n, m, func(i, j int) float64 { return -val[i][slotBin[j]] })
	members := make([][]int, N)
	usedCap := make([]int, N)
	for j, i := range rowOf {
		if i >= 0 {
			B := slotBin[j]
			members[B] = append(members[B], i)
			usedCap[B]++
		}
	}
	// Potentials: π_C ≥ π_B + max_{i∈B} (val[i][C] − val[i][B]), π ≥ 0,
	// the longest paths into each bin (no positive cycle at an optimum).
	pi := make([]float64, N)
	for range N {
		for B := range N {
			for _, i := range members[B] {
				for C := range N {
					if C != B {
						pi[C] = max(pi[C], pi[B]+val[i][C]-val[i][B])
					}
				}
			}
		}
	}
	for B := range N {
		if usedCap[B] < caps[B] {
			pi[B] = 0 // a bin with room: its capacity row is slack
		}
	}
	for _, row := range val {
		best := math.Inf(-1)
		for B, x := range row {
			best = max(best, x-pi[B])
		}
		bound += best
	}
	for B, x := range pi {
		bound += x * float64(caps[B])
	}
	return bound, steps
}

// maxExtra returns max Σ_e gain(e, c_e) over copy counts 1 ≤ c_e ≤ cmax
// with Σ_e (c_e − 1) ≤ extra, where gain(e, 1) = 0 and gains are ≥ 0: the
// most that extra redundant slots can add to a per-expert quantity. An
// exact dynamic program over (expert, slots used).
func maxExtra(E, extra, cmax int, gain func(e, c int) float64) float64 {
	if extra <= 0 || cmax < 2 {
		return 0
	}
	dp := make([]float64, extra+1) // dp[r]: best with r extra slots so far
	next := make([]float64, extra+1)
	for e := range E {
		copy(next, dp)
		for c := 2; c <= cmax; c++ {
			g := gain(e, c)
			if g <= 0 {
				continue
			}
			for r := c - 1; r <= extra; r++ {
				next[r] = max(next[r], dp[r-(c-1)]+g)
			}
		}
		dp, next = next, dp
	}
	return slices.Max(dp)
}

// topSum is the sum of the n largest values of xs (all of them when
// there are fewer), negative values excluded. It sorts xs.
func topSum(xs []float64, n int) float64 {
	slices.Sort(xs)
	s := 0.0
	for i := len(xs) - 1; i >= 0 && n > 0 && xs[i] > 0; i-- {
		s += xs[i]
		n--
	}
	return s
}
