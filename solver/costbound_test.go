package solver_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// Joint's certified bound on the exact cost model (home flow, one node)
// lies between the counting bound and the best plan's modeled time, found
// by brute force over every balanced assignment, in sequential and
// overlapped mode, and lifts the counting bound in most instances.
func TestHomeLowerBoundBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	raised := 0
	for it := 0; it < 24; it++ {
		G := 2 + rng.IntN(3)
		E := G * (2 + rng.IntN(2))
		if E > 9 {
			E = 8
			G = 4
		}
		k := 2 + rng.IntN(2)
		L := 2
		T := 20 + rng.IntN(60)
		tr := &routing.Trace{Tokens: T, Layers: L, TopK: k, Experts: E}
		for range T {
			for range L {
				perm := rng.Perm(E)
				hot := rng.IntN(2) // skewed: half the tokens prefer low ids
				for j := 0; j < k; j++ {
					e := perm[j]
					if hot == 1 {
						e = perm[j] % (E/2 + 1)
						for slices.Contains(tr.IDs[len(tr.IDs)-j:], int16(e)) {
							e = (e + 1) % E
						}
					}
					tr.IDs = append(tr.IDs, int16(e))
				}
			}
		}
		require.NoError(t, tr.Validate())
		st := tr.Stats(routing.StatsOptions{})
		m := testkit.FakeModel(E, k)
		m.Hidden = 256 + rng.IntN(8192)
		mode := costmodel.Mode(it % 2)
		p := Problem{Stats: st, Cluster: testkit.SmallCluster(1, G), Model: m, Flow: costmodel.FlowHome, Mode: mode}
		lb, ok := CountingBound(p)
		require.True(t, ok)
		best := 0.0
		parts := testkit.BalancedPartitions(E, G)
		for l := 0; l < L; l++ {
			lbest := math.Inf(1)
			for _, a := range parts {
				rows := make([][]int, L)
				for i := range rows {
					rows[i] = a
				}
				rep, err := p.Scenario().Evaluate(testkit.PlanOf(G, rows...))
				require.NoError(t, err)
				lbest = math.Min(lbest, rep.Layers[l].TimeSec)
			}
			best += lbest
		}
		name := fmt.Sprintf("it %d: E %d G %d k %d T %d mode %v", it, E, G, k, T, mode)
		assert.LessOrEqual(t, lb, best*(1+1e-12), name)
		assert.Greater(t, lb, 0.5*best, name)
		res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 1})
		require.NoError(t, err)
		// Joint's bound adds the certified busiest-GPU counts: at least the
		// counting bound, never above the brute-force optimum.
		assert.GreaterOrEqual(t, res.CostBound, lb*(1-1e-12), name)
		assert.LessOrEqual(t, res.CostBound, best*(1+1e-12), name)
		assert.InDelta(t, res.Objective/res.CostBound-1, res.CostGap, 1e-12, name)
		if res.CostBound > lb*(1+1e-9) {
			raised++
		}
	}
	t.Logf("joint's certified bound is above the counting bound in %d of 24 instances", raised)
	assert.GreaterOrEqual(t, raised, 12)
}
