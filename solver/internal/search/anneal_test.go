package search

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/onenode"
	"github.com/moetuner/moetuner/solver/internal/task"
	"github.com/moetuner/moetuner/solver/internal/testkit"
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
		sc := costmodel.Scenario{Stats: tr.Stats(routing.StatsOptions{}), Cluster: c, Model: costmodel.Model{Layers: 1, Experts: E, TopK: k, Hidden: 1024, FFN: 512, BytesPerActivation: 2}, Flow: costmodel.FlowHome}
		cls, ok := onenode.Layers(sc)
		require.True(t, ok)
		s := newAnnealLayer(cls[0], sc.Stats.Load[0], func(float64, int) float64 { return 0 })
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

// Annealing improves a bad start: from the worst of 30 random balanced
// plans it finds one at least as fast as the best of them on every
// instance, and its plan validates. A do-nothing annealing (returning its
// start) fails it; so does a random walk that returns where it ends (it
// ends near the random plans' mean).
func TestHomeAnnealImprovesBadStart(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 48))
	for it := range 8 {
		G := 2 + rng.IntN(3)
		E := G * (3 + rng.IntN(3))
		sc := testkit.RandomHomeScenario(t, rng, E, G, 2+rng.IntN(2), 3, 80+rng.IntN(100), costmodel.Mode(it%2))
		var start *placement.Plan
		worst, best := 0.0, math.Inf(1)
		for range 30 {
			p := testkit.RandomBalancedPlan(rng, sc.Stats.Layers, E, G)
			rep, err := sc.Evaluate(p)
			require.NoError(t, err)
			if rep.TimeSec > worst {
				start, worst = p, rep.TimeSec
			}
			best = math.Min(best, rep.TimeSec)
		}
		cls, ok := onenode.Layers(sc)
		require.True(t, ok)
		out, ok := HomeAnneal(context.Background(), sc, cls, start, 20000*E, 2, 2, task.Limit{Deadline: time.Now().Add(time.Minute)}, 50*time.Millisecond, uint64(it))
		require.True(t, ok)
		require.NoError(t, out.Validate(placement.ValidateOptions{Experts: E, Layers: sc.Stats.Layers}))
		rep, err := sc.Evaluate(out)
		require.NoError(t, err)
		assert.Less(t, rep.TimeSec, worst*(1-1e-9), "it %d: annealing from the worst random plan", it)
		assert.LessOrEqual(t, rep.TimeSec, best*(1+1e-12), "it %d: annealing against the best random plan", it)
	}
}
