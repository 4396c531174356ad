package affinity

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// TestRepairSequentialHoldsTheCapAsDealt: under SGLang's newest tree (one
// stream per rank), with a cap halfway between perfect balance and the
// start's median layer as dealt, repairSequential keeps the slots and
// copy counts, and leaves fewer layers over the cap, as the returned plan
// is really dealt, than repairDealt, whose swaps are only those the
// plan's own table prices as it stands (the sequential repair also moves
// replicated copies between nodes, which moves ranks' streams); what it
// reports is what the returned plan's table deals (every layer's remote
// copies). A repair that priced a layer on the streams of the plan it
// started from, or made no stream-moving swap, fails it.
func TestRepairSequentialHoldsTheCapAsDealt(t *testing.T) {
	rng := rand.New(rand.NewPCG(83, 5))
	overBefore, overAfter, overDealt := 0, 0, 0
	for it := range 8 {
		N, P := 2, 3+rng.IntN(2)
		E, K := 12+rng.IntN(8), 2+rng.IntN(2)
		red := fillSlots(E, N*P, N*P)
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, 4, 150+rng.IntN(100), red, placement.DispatchSGLangStaticNarrow, false)
		p := Problem{Scenario: sc, Slots: slots, Start: plan}
		sh, err := newShape(p)
		require.NoError(t, err)
		var imb []float64
		for l := range plan.Layers {
			imb = append(imb, newStateKappa(buildLayer(p, sh, l), int32Copies(plan.ExpertGPUs(l)), 0).imbalance(levelGPU))
		}
		mid := slices.Clone(imb)
		slices.Sort(mid)
		p.MaxImbalance = 1 + (mid[len(mid)/2]-1)/2
		for _, b := range imb {
			if b > p.MaxImbalance {
				overBefore++
			}
		}
		res := &Result{Copies: make([][][]placement.GPU, len(plan.Layers)), Remote: make([]float64, len(plan.Layers))}
		alone := &Result{Copies: make([][][]placement.GPU, len(plan.Layers)), Remote: make([]float64, len(plan.Layers))}
		for l := range plan.Layers {
			res.Copies[l] = plan.ExpertGPUs(l)
			alone.Copies[l] = plan.ExpertGPUs(l)
		}
		opts := Options{Limit: task.Limit{Work: 1 << 20}, Parallel: 1}
		repairDealt(context.Background(), p, alone, opts)
		overDealt += overCapLayers(t, p, alone)
		_, ok := repairSequential(context.Background(), p, res, opts)
		require.True(t, ok, "instance %d: not dealt sequentially", it)
		checkPlan(t, res.Copies, E, slots)
		q := p
		q.Start = placement.FromReplicas(N*P, res.Copies, "joint")
		after, err := newShape(q)
		require.NoError(t, err)
		for l := range res.Copies {
			s := newStateKappa(buildLayer(q, after, l), int32Copies(res.Copies[l]), 0)
			assert.InDelta(t, s.remote(), res.Remote[l], 1e-9*math.Max(1, s.remote()), "instance %d layer %d: remote copies reported against the plan's own table", it, l)
			if s.overCap() > 0 {
				overAfter++
			}
		}
	}
	t.Logf("layers over the cap as dealt: %d before, %d after (repairDealt: %d)", overBefore, overAfter, overDealt)
	assert.Less(t, overAfter, overDealt, "layers over the cap as dealt, against repairDealt")
}

// overCapLayers is how many layers of res's plan hold more than p's cap as
// the plan's own table deals them.
func overCapLayers(t *testing.T, p Problem, res *Result) int {
	t.Helper()
	q := p
	q.Start = placement.FromReplicas(p.Cluster.GPUs(), res.Copies, "joint")
	sh, err := newShape(q)
	require.NoError(t, err)
	n := 0
	for l := range res.Copies {
		if newStateKappa(buildLayer(q, sh, l), int32Copies(res.Copies[l]), 0).overCap() > 0 {
			n++
		}
	}
	return n
}
