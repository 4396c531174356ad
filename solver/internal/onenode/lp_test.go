package onenode

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// The column generation master's simplex agrees with gonum's LP solver on
// random covering LPs, through warm starts (columns added between solves)
// and restarts (columns withdrawn), and its duals are feasible and tight:
// y ≥ 0, every allowed column prices at ≥ 0, and y·rhs equals the
// objective.
func TestCoverLPMatchesGonum(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	for it := range 40 {
		m := 4 + rng.IntN(20)
		c := newCoverLP(m, rng)
		for e := 0; e < m; e++ {
			c.add([]int{e})
		}
		addRandom := func(n int) {
			for range n {
				k := 2 + rng.IntN(min(6, m-1))
				perm := rng.Perm(m)[:k]
				c.add(perm)
			}
		}
		addRandom(5 + rng.IntN(40))
		for round := range 4 {
			if round == 2 {
				// Withdraw a random third of the non-singleton columns.
				for j := m; j < len(c.cols); j++ {
					c.allow[j] = rng.IntN(3) > 0
				}
			}
			obj, y, ok := c.solve(100000)
			require.True(t, ok, "it %d round %d", it, round)
			want := gonumCover(t, c)
			require.InDelta(t, want, obj, 1e-6*(1+want), "it %d round %d", it, round)
			dual := 0.0
			for e := range y {
				require.GreaterOrEqual(t, y[e], -1e-9)
				dual += y[e] * c.rhs[e]
			}
			require.InDelta(t, obj, dual, 1e-7*(1+obj))
			for j, rows := range c.cols {
				if !c.allow[j] {
					continue
				}
				d := 1.0
				for _, e := range rows {
					d -= y[e]
				}
				require.GreaterOrEqual(t, d, -1e-7, "column %d prices negative", j)
			}
			addRandom(3 + rng.IntN(10))
		}
	}
}

// gonumCover solves the same LP (allowed columns, surpluses) with gonum.
func gonumCover(t *testing.T, c *coverLP) float64 {
	var use []int
	for j := range c.cols {
		if c.allow[j] {
			use = append(use, j)
		}
	}
	n := len(use) + c.m
	A := mat.NewDense(c.m, n, nil)
	cost := make([]float64, n)
	for k, j := range use {
		cost[k] = 1
		for _, e := range c.cols[j] {
			A.Set(e, k, 1)
		}
	}
	for e := 0; e < c.m; e++ {
		A.Set(e, len(use)+e, -1)
	}
	opt, _, err := lp.Simplex(cost, A, c.rhs, 1e-10, nil)
	require.NoError(t, err)
	return opt
}
