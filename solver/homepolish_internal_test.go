package solver

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
)

// swapDelta, which scores annealing moves without making them, predicts
// exactly how a swap changes the two GPUs' distinct-token counts, over
// thousands of random swaps on tokens that share experts.
func TestSwapDeltaMatchesMove(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	c, err := costmodel.ClusterPreset("h100x8")
	require.NoError(t, err)
	for _, E := range []int{8, 16, 24} {
		k := 3
		tr := &routing.Trace{Tokens: 300, Layers: 1, TopK: k, Experts: E}
		for range tr.Tokens {
			var pick []int
			for len(pick) < k {
				e := rng.IntN(E)
				if rng.IntN(2) == 0 {
					e = rng.IntN(E/4 + 1) // a hot quarter, so tokens share experts
				}
				if !slices.Contains(pick, e) {
					pick = append(pick, e)
				}
			}
			for _, e := range pick {
				tr.IDs = append(tr.IDs, int16(e))
			}
		}
		require.NoError(t, tr.Validate())
		p := Problem{Stats: tr.Stats(routing.StatsOptions{}), Cluster: c, Model: costmodel.Model{Layers: 1, Experts: E, TopK: k, Hidden: 1024, FFN: 512, BytesPerActivation: 2}, Flow: costmodel.FlowHome}
		cls, ok := coverLayers(p)
		require.True(t, ok)
		s := newAnnealLayer(cls[0], p.Stats.Load[0], func(float64, int) float64 { return 0 })
		a := make([]int, E)
		for i, e := range rng.Perm(E) {
			a[e] = i / (E / 8)
		}
		s.set(a)
		for range 3000 {
			e1, e2 := rng.IntN(E), rng.IntN(E)
			g1, g2 := s.a[e1], s.a[e2]
			if g1 == g2 {
				continue
			}
			d1, d2 := s.swapDelta(e1, e2)
			b1, b2 := s.D[g1], s.D[g2]
			s.move(e1, g2)
			s.move(e2, g1)
			require.Equal(t, b1+d1, s.D[g1], "E %d swap %d,%d", E, e1, e2)
			require.Equal(t, b2+d2, s.D[g2], "E %d swap %d,%d", E, e1, e2)
			if rng.IntN(2) == 0 { // undo half of them
				s.move(e1, g1)
				s.move(e2, g2)
			}
		}
	}
}
