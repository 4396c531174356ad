package rebalance

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver"
)

// TestFreshPlanSolvesOnTheDeal: a count-only solve (freshPlan, the one
// Propose and Backtest make without per-token paths) plans on the dispatch
// it is given. On random one-node instances under SGLang's table, with a
// work budget, the plan made on the table is never slower as dealt than
// the one made on the table's expectation (static-mean), and is faster on
// some. A solve that ignored the dispatch would make the same plan both
// ways and fail.
func TestFreshPlanSolvesOnTheDeal(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 3))
	faster := 0
	for trial := range 20 {
		L, E, G, per := 2+rng.IntN(2), 6+rng.IntN(6), 4+4*rng.IntN(2), 3
		c, m := tinyCluster(1, G), tinyModel(L, E, 2)
		load := skewedLoad(rng, L, E)
		slots := make([]int, G)
		for g := range slots {
			slots[g] = per
		}
		var sec [2]float64
		for i, d := range []placement.Dispatch{placement.DispatchSGLangStatic, placement.DispatchStaticMean} {
			res, err := freshPlan(context.Background(), load, c, m, d, slots, solver.Options{Effort: 1}, 0)
			require.NoError(t, err)
			sec[i] = dealtWindowSec(t, res.Plan, [][][]float64{load}, c, m, placement.DispatchSGLangStatic)
		}
		assert.LessOrEqual(t, sec[0], sec[1]*(1+1e-9), "trial %d: planned on the deal, slower as dealt", trial)
		if sec[0] < sec[1]*(1-1e-9) {
			faster++
		}
	}
	assert.GreaterOrEqual(t, faster, 4, "plans made on the deal that are faster as dealt")
}
