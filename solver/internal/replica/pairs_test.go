package replica

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/moetuner/moetuner/mip/highs"
	"github.com/moetuner/moetuner/solver/internal/task"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// The exact pair bound, not capped by any plan, never exceeds the
// brute-force optimum of one- and two-slot layers and stays within 10 % of
// it (bisecting on [opt/2, 2·opt]). Returning the upper end of the
// interval (a bound that cannot fail) breaks the first; returning the
// lower end breaks the second.
func TestPairBoundBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	opts := Options{PairProbeMin: 500 * time.Millisecond, PairProbeShare: 0.25, PairProofShare: 0.5}
	minRatio := 1.0
	for it := 0; it < 24; it++ {
		G := 2 + rng.IntN(3)
		slots := make([]int, G)
		S := 0
		for g := range slots {
			slots[g] = 2
			if it%3 == 2 && g < G/2 {
				slots[g] = 1 // mixed one- and two-slot GPUs
			}
			S += slots[g]
		}
		E := 2 + rng.IntN(S-2)
		load := make([]float64, E)
		for e := range load {
			load[e] = math.Round(1000 / math.Pow(float64(e+1), 0.5+rng.Float64()))
		}
		opt := testkit.BruteBusiestSlots(load, slots)
		var single, double []int
		for g, s := range slots {
			if s == 1 {
				single = append(single, g)
			} else {
				double = append(double, g)
			}
		}
		name := fmt.Sprintf("load %v slots %v", load, slots)
		pb, _, _ := pairRefine(context.Background(), highs.Backend{}, load, single, double, opt/2, 2*opt, task.ByTime(context.Background(), time.Now().Add(5*time.Second)), opts)
		assert.LessOrEqual(t, pb, opt*(1+1e-9), "pair bound above the optimum: %s", name)
		assert.GreaterOrEqual(t, pb, opt*0.9, "pair bound far below the optimum: %s", name)
		minRatio = math.Min(minRatio, pb/opt)
	}
	t.Logf("pair bound ≥ %.4f × optimum", minRatio)
}
