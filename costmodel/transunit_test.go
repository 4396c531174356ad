package costmodel

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTransUnitMatchesPatterns: on random chain-flow instances with one
// copy of every expert (where every share is certain), the masked pass
// (transUnit) gives every transition mass the same bits as the pass
// through each pattern's destination probabilities (addTransPattern);
// plans with copies do not take it. A pair counted twice or a node mass
// from the wrong layer fails it.
func TestTransUnitMatchesPatterns(t *testing.T) {
	rng := rand.New(rand.NewPCG(71, 3))
	shapes := []struct{ nodes, gpn int }{{1, 2}, {2, 2}, {2, 3}, {3, 2}, {4, 4}}
	unit := 0
	for it := range 80 {
		sh := shapes[it%len(shapes)]
		plan, st, m := randomInstance(rng, sh.nodes, sh.gpn, it%4 == 3)
		c := tinyCluster(sh.nodes, sh.gpn)
		ev, err := newEngine(st, c, m, Scenario{Stats: st, Cluster: c, Model: m, Flow: FlowChain}.Options())
		require.NoError(t, err)
		shs, err := ev.planShares(plan)
		require.NoError(t, err)
		for l := 1; l < st.Layers; l++ {
			prev, cur := &shs[l-1], &shs[l]
			if !prev.unit || !cur.unit {
				continue
			}
			unit++
			var a, b massSet
			a.init(ev.g, ev.n)
			b.init(ev.g, ev.n)
			ev.transUnit(l, prev, cur, &a)
			for i := range st.Patterns {
				ev.addTransPattern(l, i, prev, cur, 1, &b)
			}
			require.True(t, slices.Equal(a.mass, b.mass), "instance %d layer %d GPU masses", it, l)
			require.True(t, slices.Equal(a.nmass, b.nmass), "instance %d layer %d node masses", it, l)
		}
	}
	require.Greater(t, unit, 40, "the instances must have layers of single copies")
}
