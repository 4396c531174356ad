package costmodel

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// TestBalancePerUnitOfSpeed: a cluster loaded in proportion to its GPUs'
// speeds reads 1, the raw busiest/mean would not; nil speeds are raw.
func TestBalancePerUnitOfSpeed(t *testing.T) {
	tok := []float64{200, 100, 100, 100}
	speed := []float64{2, 1, 1, 1}
	assert.InDelta(t, 1, Balance(tok, speed), 1e-12)
	assert.InDelta(t, 200/125.0, Balance(tok, nil), 1e-12)
	b, g := BalanceAt([]float64{1, 5, 5, 2}, nil)
	assert.InDelta(t, 5/3.25, b, 1e-12)
	assert.Equal(t, 1, g, "first of equals")
	assert.Equal(t, 1.0, Balance([]float64{0, 0}, nil))
}

// TestCapExcess checks the cap's penalty by hand: per GPU, per node group,
// zero within the cap and without one.
func TestCapExcess(t *testing.T) {
	tok := []float64{30, 10, 10, 10} // mean 15, busiest 30
	c := Cap{Max: 1.5}
	assert.InDelta(t, 30-1.5*15, c.Excess(tok, nil, 1), 1e-6)
	assert.InDelta(t, 20-15.0, Cap{Max: 1}.Excess(tok, nil, 2), 1e-6, "node 0's mean GPU holds 20")
	assert.Zero(t, Cap{Max: 2}.Excess(tok, nil, 1))
	assert.Zero(t, Cap{}.Excess(tok, nil, 1))
	assert.False(t, c.Holds(tok, nil))
	assert.True(t, Cap{Max: 2}.Holds(tok, nil))
	assert.True(t, Cap{}.Holds(tok, nil))
	// Per unit of speed: a GPU twice as fast may hold twice the tokens.
	assert.Zero(t, Cap{Max: 1}.Excess([]float64{20, 10, 10}, []float64{2, 1, 1}, 1))
}

// TestMoveBudget counts changed slots against a running layer as
// placement.ChangedSlots does, on random swaps.
func TestMoveBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const G, E = 4, 8
	run := placement.LayerPlan{}
	for e := range E {
		run.SlotExpert = append(run.SlotExpert, routing.Expert(e))
		run.SlotGPU = append(run.SlotGPU, placement.GPU(e%G))
	}
	b := NewMoveBudget(run, G, E, 3, 0.5)
	cur := placement.LayerPlan{SlotExpert: append([]routing.Expert(nil), run.SlotExpert...), SlotGPU: append([]placement.GPU(nil), run.SlotGPU...)}
	changed := 0
	for range 200 {
		i, j := rng.IntN(E), rng.IntN(E)
		a, c := int(cur.SlotGPU[i]), int(cur.SlotGPU[j])
		changed += b.SwapChanged(a, int(cur.SlotExpert[i]), c, int(cur.SlotExpert[j]))
		cur.SlotGPU[i], cur.SlotGPU[j] = cur.SlotGPU[j], cur.SlotGPU[i]
		require.Equal(t, placement.ChangedSlots(run, cur), changed)
		assert.Equal(t, changed <= 3, b.Allows(changed))
		assert.InDelta(t, 0.5*float64(changed), b.Charge(changed), 1e-12)
	}
}

// TestTermsMatchEvaluate: every layer's report is Terms' compute rule per
// GPU and Terms' layer-time rule of its tail and phases, in both modes, on
// GPUs of mixed speeds.
func TestTermsMatchEvaluate(t *testing.T) {
	c := Cluster{Name: "t", Nodes: 2, GPUsPerNode: 2, NVLinkGBps: 900, NICGbps: 400, TokenCost: 3, ExpertCost: 50, Speed: []float64{1, 2, 1, 1.5}}
	rng := rand.New(rand.NewPCG(1, 2))
	for it := range 20 {
		plan, st, m := randomInstance(rng, 2, 2, it%2 == 0)
		termsMatchEvaluate(t, plan, st, c, m)
	}
}

func termsMatchEvaluate(t *testing.T, plan *placement.Plan, st *routing.Stats, c Cluster, m Model) {
	for _, mode := range []Mode{Sequential, Overlapped} {
		rep, err := Evaluate(plan, st, c, m, Options{Mode: mode, Chunks: 3})
		require.NoError(t, err)
		terms := NewTerms(c, m, mode, 3)
		for l, lr := range rep.Layers {
			slots := plan.SlotsPerGPU(l)
			tail := 0.0
			for g := range lr.Tokens {
				x := terms.Compute(g, lr.Tokens[g], float64(slots[g]))
				assert.InDelta(t, x, lr.Compute[g].Seconds(), 1e-9)
				tail = math.Max(tail, x)
			}
			seq, ideal, over := terms.Times(tail, lr.DispatchTime.Seconds(), lr.CombineTime.Seconds())
			assert.InDelta(t, seq, lr.Sequential.Seconds(), 2e-9, "layer %d", l)
			assert.InDelta(t, ideal, lr.Ideal.Seconds(), 2e-9, "layer %d", l)
			assert.InDelta(t, over, lr.Overlapped.Seconds(), 2e-9, "layer %d", l)
			assert.InDelta(t, terms.LayerSec(tail, lr.DispatchTime.Seconds(), lr.CombineTime.Seconds()), lr.TimeSec, 2e-9)
			assert.InDelta(t, Balance(lr.Tokens, c.Speed), lr.Balance, 1e-12)
		}
	}
}
