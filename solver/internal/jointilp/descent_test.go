package jointilp

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
)

// TestChainLayerILPMatchesModel: for every assignment of one layer, the
// per-layer descent ILP's objective differs from the joint model's total
// (with every transition pair kept) by the same constant: the terms of the
// fixed layers. So minimising it minimises the model.
func TestChainLayerILPMatchesModel(t *testing.T) {
	for _, tc := range []struct {
		nodes, per int
		mode       costmodel.Mode
	}{{1, 3, costmodel.Sequential}, {3, 1, costmodel.Sequential}, {1, 3, costmodel.Overlapped}} {
		rng := rand.New(rand.NewPCG(4, uint64(tc.nodes)))
		const L, E = 3, 6
		tr := &routing.Trace{Tokens: 300, Layers: L, TopK: 2, Experts: E, IDs: make([]int16, 300*L*2)}
		for i := 0; i < 300*L; i++ {
			a := rng.IntN(E)
			b := (a + 1 + rng.IntN(E-1)) % E
			tr.IDs[2*i], tr.IDs[2*i+1] = int16(a), int16(b)
		}
		c, err := costmodel.ClusterPreset("h100x8")
		require.NoError(t, err)
		c = c.WithNodes(tc.nodes)
		c.GPUsPerNode = tc.per
		sc := costmodel.Scenario{Stats: tr.Stats(routing.StatsOptions{}), Cluster: c, Flow: costmodel.FlowChain, Mode: tc.mode,
			Model: costmodel.Model{Name: "t", Layers: L, Experts: E, TopK: 2, Hidden: 4096, FFN: 14336, BytesPerActivation: 2}}
		jm, err := New(sc, E*E)
		require.NoError(t, err)
		base := [][]int{{0, 0, 1, 1, 2, 2}, {2, 1, 0, 2, 1, 0}, {1, 2, 2, 0, 0, 1}}
		for l := range L {
			b, lv := jm.buildChainLayer(l, base)
			m := b.Model()
			diff := math.NaN()
			var all [][]int
			var rec func(e int, cur []int, cnt []int)
			rec = func(e int, cur []int, cnt []int) {
				if e == E {
					all = append(all, append([]int(nil), cur...))
					return
				}
				for g := range 3 {
					if cnt[g] < 2 {
						cnt[g]++
						rec(e+1, append(cur, g), cnt)
						cnt[g]--
					}
				}
			}
			rec(0, nil, make([]int, 3))
			for _, a := range all {
				x := make([]float64, len(m.Cost))
				for j := range x {
					if m.Lower[j] == m.Upper[j] {
						x[j] = m.Lower[j]
					}
				}
				for e, g := range a {
					x[lv.x[e][g]] = 1
				}
				fillEpigraphs(b, x)
				require.NoError(t, m.Check(x, 1e-9))
				trial := [][]int{base[0], base[1], base[2]}
				trial[l] = a
				d := m.Value(x) - jm.Objective(trial)
				if math.IsNaN(diff) {
					diff = d
				}
				assert.InDelta(t, diff, d, 1e-6*math.Abs(jm.Objective(trial)), "nodes %d layer %d assignment %v", tc.nodes, l, a)
			}
		}
	}
}
