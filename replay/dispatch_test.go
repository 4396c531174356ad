package replay

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// TestWorkloadFollowsDispatch: under every per-source dispatch the
// replayed tokens per GPU are the cost model's (which a token-by-token
// recount checks in costmodel), within the rounding of each expert's
// tokens to whole ones; under SGLang's table they differ from the even
// split's.
func TestWorkloadFollowsDispatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	const G, P, E, K, L, S, T = 4, 2, 6, 2, 2, 2, 400
	tr := &routing.Trace{Tokens: T, Layers: L, TopK: K, Experts: E, Source: make([]int32, T)}
	for tok := range T {
		h := rng.IntN(G)
		tr.Source[tok] = int32(h)
		for range L {
			a := (h + rng.IntN(2)) % E
			if rng.IntN(3) == 0 {
				a = rng.IntN(E)
			}
			b := (a + 1 + rng.IntN(E-1)) % E
			tr.IDs = append(tr.IDs, int16(a), int16(b))
		}
	}
	require.NoError(t, tr.Validate())
	plan := &placement.Plan{GPUs: G, Experts: E}
	for range L {
		var lp placement.LayerPlan
		perm := rng.Perm(G)
		for p := range G * S {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(p%E))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(perm[p/S]))
		}
		plan.Layers = append(plan.Layers, lp)
	}
	require.NoError(t, plan.Validate(placement.ValidateOptions{}))
	m := costmodel.Model{Name: "m", Layers: L, Experts: E, TopK: K, Hidden: 8, FFN: 8, BytesPerActivation: 2}
	c := costmodel.Cluster{Name: "c", Nodes: G / P, GPUsPerNode: P, NVLinkGBps: 900, NICGbps: 400, TokenCost: 1, ExpertCost: 1}
	differs := false
	for _, d := range []placement.Dispatch{placement.DispatchSGLangStatic, placement.DispatchSGLangStaticNarrow, placement.DispatchSGLangDynamic, placement.DispatchStaticMean} {
		w, err := NewWorkload(plan, Input{Trace: tr}, WorkloadOptions{Dispatch: d, GPUsPerNode: P})
		require.NoError(t, err, "%v", d)
		rep, err := costmodel.Evaluate(plan, tr.Stats(routing.StatsOptions{}), c, m, costmodel.Options{Dispatch: d})
		require.NoError(t, err)
		even, err := costmodel.Evaluate(plan, tr.Stats(routing.StatsOptions{}), c, m, costmodel.Options{})
		require.NoError(t, err)
		for l := range L {
			got := make([]float64, G)
			for s, n := range w.SlotTokens[0][l] {
				got[plan.Layers[l].SlotGPU[s]] += float64(n)
			}
			for g := range G {
				assert.InDelta(t, rep.Layers[l].Tokens[g], got[g], float64(E), "%v layer %d GPU %d", d, l, g)
				if d == placement.DispatchSGLangStatic && math.Abs(even.Layers[l].Tokens[g]-got[g]) > float64(E) {
					differs = true
				}
			}
		}
	}
	assert.True(t, differs, "SGLang's table is not the even split")
}
