package capfix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestFloorHoldsUnderVLLMHash: under vLLM's dispatch counted token by
// token (the trace's token order attached), imbalanceFloor of a plan with
// replicated experts is at most the plan's own busiest/mean by Evaluate,
// as a lower bound over every plan with its copy counts must be. A floor
// that gave every copy its even share, vLLM's expectation, fails it: the
// hash sends some copies less, and the test checks that such instances
// occur.
func TestFloorHoldsUnderVLLMHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 11))
	evenAbove := 0
	for it := range 200 {
		G, S := 3+it%2, 2+it%2
		E := G*S - 1 - rng.IntN(G)
		K := 1 + rng.IntN(2)
		name := fmt.Sprintf("%d-G%dS%dE%dK%d", it, G, S, E, K)
		tr := &routing.Trace{Tokens: 12 + rng.IntN(20), Layers: 1, TopK: K, Experts: E}
		tr.Source = make([]int32, tr.Tokens)
		for tok := range tr.Tokens {
			tr.Source[tok] = int32(rng.IntN(G))
			pick := rng.Perm(E)[:K]
			if rng.IntN(2) == 0 && !slices.Contains(pick, 0) {
				pick[0] = 0 // a hot expert
			}
			for _, e := range pick {
				tr.IDs = append(tr.IDs, int16(e))
			}
		}
		require.NoError(t, tr.Validate(), name)
		st := tr.Stats(routing.StatsOptions{PathError: -1})
		var err error
		st.Order, err = tr.TokenOrder(0)
		require.NoError(t, err, name)
		m := testkit.FakeModel(E, K)
		m.Layers = 1
		c := testkit.SmallCluster(1, G)
		sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: placement.DispatchVLLM}
		require.True(t, sc.PerSource(), name)
		// Every expert once, the spare slots to random experts on GPUs
		// without a copy of them.
		lp := placement.LayerPlan{}
		perm := rng.Perm(G * S)
		for i, p := range perm {
			e := i
			if e >= E {
				e = rng.IntN(E)
			}
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(p/S))
		}
		plan := &placement.Plan{GPUs: G, Experts: E, Layers: []placement.LayerPlan{lp}}
		if plan.Validate(placement.ValidateOptions{Experts: E, Layers: 1}) != nil {
			continue // two copies of an expert on one GPU
		}
		rep, err := sc.Evaluate(plan)
		require.NoError(t, err, name)
		speed := make([]float64, G)
		for g := range speed {
			speed[g] = c.SpeedOf(g)
		}
		ratio := ratioOf(rep.Layers[0].Tokens, speed)
		floor, _ := imbalanceFloor(Problem{Scenario: sc}, 0, lp, speed)
		assert.LessOrEqual(t, floor, ratio+1e-9, "%s: the floor above the plan's own busiest/mean", name)
		noOrder := *st
		noOrder.Order = nil
		even := sc
		even.Stats = &noOrder
		if f, _ := imbalanceFloor(Problem{Scenario: even}, 0, lp, speed); f > ratio+1e-9 {
			evenAbove++
		}
	}
	t.Logf("the even shares' floor above the plan's busiest/mean on %d instances", evenAbove)
	assert.Positive(t, evenAbove, "no instance where the even shares overstate the floor: the test proves nothing")
}

// ratioOf is the busiest GPU's tokens per unit of speed over the mean.
func ratioOf(tokens, speed []float64) float64 {
	var sum, ssum, top float64
	for g, x := range tokens {
		sum += x
		ssum += speed[g]
		top = max(top, x/speed[g])
	}
	return top / (sum / ssum)
}
