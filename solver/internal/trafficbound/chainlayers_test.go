package trafficbound

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestChainLayersBelowCostModelOptimum: on small chain-flow instances the
// sum of ChainLayers' bounds never exceeds the least dispatch copies
// across nodes that the cost model counts (Report.RemoteCopies) over every
// single-copy plan of every layer, enumerated. It ties the pieces (the
// homes' dispatch for layer 0, the transitions after it) to what the cost
// model counts: a bound on another quantity, or one summed over the wrong
// layers, fails it, and so does a vacuous one.
func TestChainLayersBelowCostModelOptimum(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 5))
	shapes := []struct{ E, N, P, slots, k int }{{4, 2, 2, 1, 2}, {4, 2, 1, 2, 2}, {6, 3, 1, 2, 2}, {4, 2, 1, 2, 1}}
	ratio := 0.0
	for i := range 8 {
		s := shapes[i%len(shapes)]
		layers := 3
		if s.E > 4 {
			layers = 2 // 90 placements a layer
		}
		in := randomInstance(r, s.E, s.N, s.P, s.slots, s.k, 4+r.IntN(5), layers, true)
		st := in.stats
		bs, err := ChainLayers(context.Background(), st, in.shape, Options{Parallel: 2})
		require.NoError(t, err)
		require.Len(t, bs, st.Layers)
		bound := 0.0
		for l, b := range bs {
			bound += b.Value
			if l > 0 { // the shared pair budgets change nothing
				one, err := ChainCrossNode(context.Background(), st, l, in.shape, Options{})
				require.NoError(t, err)
				assert.Equal(t, one.Value, b.Value, "%s layer %d", in.name, l)
			}
		}
		sc := costmodel.Scenario{Stats: st, Cluster: testkit.SmallCluster(s.N, s.P), Model: testkit.FakeModel(s.E, s.k), Flow: costmodel.FlowChain}
		G := s.N * s.P
		layer := testkit.Assignments(s.E, G) // s.slots = E/G each
		best := math.Inf(1)
		testkit.Tuples(len(layer), st.Layers, func(idx []int) {
			rep, err := sc.Evaluate(testkit.PlanOf(G, pick(layer, idx)...))
			require.NoError(t, err)
			best = min(best, rep.RemoteCopies)
		})
		assert.LessOrEqual(t, bound, best*(1+1e-9)+1e-9, "%s: bound %v above the cost model's optimum %v", in.name, bound, best)
		ratio += bound / max(best, 1e-12)
	}
	// Not vacuous (a bound of 0 passes the check above): 0.74 measured.
	assert.Greater(t, ratio/8, 0.5, "mean bound/optimum")
}

// pick returns the items of xs at idx.
func pick[T any](xs []T, idx []int) []T {
	out := make([]T, len(idx))
	for i, j := range idx {
		out[i] = xs[j]
	}
	return out
}
