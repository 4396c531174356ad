package replica

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// unbalancedPlan is a random GPU-major plan of L layers: every expert once
// and R more copies of random experts, S = (E+R)/G slots on each GPU, in
// random order, so a budgeted re-plan has moves worth making.
func unbalancedPlan(rng *rand.Rand, G, E, R, L int) *placement.Plan {
	plan := &placement.Plan{GPUs: G, Experts: E}
	S := (E + R) / G
	for range L {
		var lp placement.LayerPlan
		for i, x := range rng.Perm(G * S) {
			e := x
			if e >= E {
				e = rng.IntN(E)
			}
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(i/S))
		}
		plan.Layers = append(plan.Layers, lp)
	}
	return plan
}

// TestMoveBudgetNeverExceeded: from random running plans, with random
// budgets (odd ones included: a swap touches two slots, a recount one),
// move costs and dispatches (even, and static-mean, whose re-place runs
// the static swaps after the packer), the packer touches at most MaxMoves
// slots of every layer (improveCost's count), the slots that differ from
// the running plan (MoveBudget.Changed) are at most those it touched, and
// the solve's plan changes at most MaxMoves slots of every layer
// (placement.ChangedSlots). Most layers do move, and some use their whole
// budget, so a check that let one more move through would fail.
func TestMoveBudgetNeverExceeded(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 7))
	moved, full, layers := 0, 0, 0
	for trial := range 16 {
		G := 4 + rng.IntN(5)
		E := 2*G + rng.IntN(G)
		R := 2*G - E%G
		const L = 2
		sc := staticScenario(t, rng, 1, G, E, 2, L, 500)
		if trial%2 == 0 {
			sc.Dispatch = placement.DispatchEven
		}
		run := unbalancedPlan(rng, G, E, R, L)
		maxMoves := 1 + rng.IntN(7)
		cost := []float64{0, 0, 1e-3}[trial%3]
		p := Problem{Scenario: sc, RedundantSlots: R, Current: run, MaxMoves: maxMoves, MoveCost: cost}
		for l := range L {
			pk := newPacker(G, perGPU(G, (E+R)/G), ones(G), [][]float64{sc.Stats.Load[l]}, AcrossMean)
			require.NoError(t, pk.load(run, l, E))
			mb := p.budget(l)
			m := task.Limit{Work: 1 << 20}.Meter(context.Background())
			touched := pk.improveCost(allGPUs(G), m, mb)
			changed := mb.Changed(pk.copies(E))
			require.LessOrEqual(t, touched, maxMoves, "trial %d layer %d: slots touched", trial, l)
			require.LessOrEqual(t, changed, touched, "trial %d layer %d: slots changed against the running plan", trial, l)
			require.Equal(t, changed, placement.ChangedSlots(run.Layers[l], placeCopies(pk.copies(E))), "trial %d layer %d: MoveBudget.Changed counts as placement.ChangedSlots", trial, l)
		}
		opts := Options{Start: time.Now(), Deadline: time.Now().Add(time.Minute), LayerShare: 1, NoPolish: true, Work: 1 << 22}
		res, err := Solve(context.Background(), p, nil, opts)
		require.NoError(t, err)
		for l := range L {
			layers++
			n := placement.ChangedSlots(run.Layers[l], res.Plan.Layers[l])
			require.LessOrEqual(t, n, maxMoves, "trial %d layer %d (%v, cost %v): changed slots of the solve", trial, l, sc.Dispatch, cost)
			if n > 0 {
				moved++
			}
			if n == maxMoves {
				full++
			}
		}
	}
	t.Logf("%d of %d layers moved, %d used their whole budget", moved, layers, full)
	assert.Greater(t, moved, layers/2, "most layers must move, or the budget is not what stops them")
	assert.Positive(t, full, "some layer must spend its whole budget")
	_, err := Solve(context.Background(), Problem{MaxMoves: -1}, nil, Options{})
	require.ErrorContains(t, err, "MaxMoves")
}

func ones(G int) []float64 {
	s := make([]float64, G)
	for g := range s {
		s[g] = 1
	}
	return s
}

func perGPU(G, S int) []int {
	s := make([]int, G)
	for g := range s {
		s[g] = S
	}
	return s
}

func allGPUs(G int) []int {
	s := make([]int, G)
	for g := range s {
		s[g] = g
	}
	return s
}

// placeCopies is a layer plan holding copies (copies[e]: the GPU of every
// slot of e).
func placeCopies(copies [][]placement.GPU) placement.LayerPlan {
	var lp placement.LayerPlan
	for e, gs := range copies {
		for _, g := range gs {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, g)
		}
	}
	return lp
}
