package assign

import (
	"math"
	"math/rand/v2"
	"testing"
)

// best is the least total cost over every injective row → column map, by
// enumeration.
func best(n, m int, c [][]float64) float64 {
	out := math.Inf(1)
	taken := make([]bool, m)
	var rec func(i int, sum float64)
	rec = func(i int, sum float64) {
		if i == n {
			out = math.Min(out, sum)
			return
		}
		for j := range m {
			if !taken[j] {
				taken[j] = true
				rec(i+1, sum+c[i][j])
				taken[j] = false
			}
		}
	}
	rec(0, 0)
	return out
}

// Min is a valid assignment (every row on one column, no column twice) of
// the brute-force least cost on random square and rectangular instances,
// negative costs included. It catches a greedy or identity assignment,
// which misses the optimum on most of these.
func TestMinIsOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 1 + rng.IntN(5)
		m := n + rng.IntN(3)
		c := make([][]float64, n)
		for i := range c {
			c[i] = make([]float64, m)
			for j := range c[i] {
				c[i][j] = math.Round(rng.NormFloat64()*10) / 2
			}
		}
		rowOf, steps := Min(n, m, func(i, j int) float64 { return c[i][j] })
		seen := make([]int, n)
		got := 0.0
		for j, i := range rowOf {
			if i < 0 {
				continue
			}
			seen[i]++
			got += c[i][j]
		}
		for i, k := range seen {
			if k != 1 {
				t.Fatalf("trial %d: row %d assigned %d times", trial, i, k)
			}
		}
		if want := best(n, m, c); math.Abs(got-want) > 1e-9 {
			t.Fatalf("trial %d (%d×%d): cost %v, optimum %v", trial, n, m, got, want)
		}
		if steps <= 0 {
			t.Fatalf("trial %d: no work counted", trial)
		}
	}
}
