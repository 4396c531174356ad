package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// TestDealtSearchPricesWhatIsDealt: under SGLang's static table the home
// search sees every GPU's tokens as the returned plan is really dealt. Its
// split is bound to the start's table, and a table is dealt over one random
// stream, so the search keeps every expert's copy count (a changed count
// would re-deal the experts after it, in its layer and in the layers other
// goroutines search) and only moves copies. On random replicated
// instances every (layer, expert) keeps the start's count, and each layer's
// per-GPU tokens under the start's table equal those under the table dealt
// for the result. A search that re-apportions copies (retargets) under the
// deal fails both: its layers' loads are then priced on a table no GPU
// gets.
func TestDealtSearchPricesWhatIsDealt(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 7))
	worst, moved := 0.0, 0
	for it := range 6 {
		N, P := 2+rng.IntN(2), 2+rng.IntN(2)
		E, K := 8+rng.IntN(8), 2+rng.IntN(2)
		red := fillSlots(E, N*P, N*P)
		t.Run(fmt.Sprintf("%d-N%dP%dE%dR%d", it, N, P, E, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 3, 120+rng.IntN(80), red, placement.DispatchSGLangStatic, false)
			p := Problem{Scenario: sc, Slots: slots, Start: plan}
			opts := Options{Limit: task.Limit{Work: 4000}, Parallel: 2, Shares: Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15}}
			res, err := Solve(context.Background(), p, opts)
			require.NoError(t, err)
			checkPlan(t, res.Copies, E, slots)
			got := placement.FromReplicas(N*P, res.Copies, "joint")
			q := p
			q.Start = got
			start, err := newShape(p)
			require.NoError(t, err)
			dealt, err := newShape(q)
			require.NoError(t, err)
			for l := range res.Copies {
				for e := range E {
					assert.Equal(t, len(plan.ExpertGPUs(l)[e]), len(res.Copies[l][e]), "layer %d expert %d: copy count", l, e)
					if !slicesEqualGPU(plan.ExpertGPUs(l)[e], res.Copies[l][e]) {
						moved++
					}
				}
				cp := int32Copies(res.Copies[l])
				a := newStateKappa(buildLayer(p, start, l), cp, 0)
				b := newStateKappa(buildLayer(q, dealt, l), cp, 0)
				for g := range a.tok {
					worst = math.Max(worst, math.Abs(a.tok[g]-b.tok[g])/math.Max(1, b.tok[g]))
				}
			}
		})
	}
	assert.Less(t, worst, 1e-9, "the search's per-GPU tokens against the table dealt for its plan")
	assert.Positive(t, moved, "the searches moved copies")
}

// slicesEqualGPU reports whether a and b hold the same GPUs in any order.
func slicesEqualGPU(a, b []placement.GPU) bool {
	if len(a) != len(b) {
		return false
	}
	for _, g := range a {
		found := false
		for _, h := range b {
			found = found || g == h
		}
		if !found {
			return false
		}
	}
	return true
}

// TestRepairDealtBalancesAsDealt: repairDealt, run on a plan as if the
// search had returned it, keeps every replicated expert's copies where they
// are (so the table dealt for the plan is the one it priced), never raises a
// layer's surrogate cost under that table, and lowers the layers' busiest
// GPU as SGLang's newest tree deals the plan on most instances. A repair
// that moved a replicated copy, or did nothing, fails it.
func TestRepairDealtBalancesAsDealt(t *testing.T) {
	rng := rand.New(rand.NewPCG(71, 9))
	better, runs := 0, 0
	for it := range 8 {
		N, P := 2, 3+rng.IntN(2)
		E, K := 12+rng.IntN(8), 2+rng.IntN(2)
		red := fillSlots(E, N*P, N*P)
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, 3, 150+rng.IntN(100), red, placement.DispatchSGLangStaticNarrow, false)
		p := Problem{Scenario: sc, Slots: slots, Start: plan}
		res := &Result{Copies: make([][][]placement.GPU, len(plan.Layers)), Remote: make([]float64, len(plan.Layers))}
		for l := range plan.Layers {
			res.Copies[l] = plan.ExpertGPUs(l)
		}
		repairDealt(context.Background(), p, res, Options{Parallel: 2})
		checkPlan(t, res.Copies, E, slots)
		q := p
		q.Start = placement.FromReplicas(N*P, res.Copies, "joint")
		shBefore, err := newShape(p)
		require.NoError(t, err)
		shAfter, err := newShape(q)
		require.NoError(t, err)
		for l := range res.Copies {
			for e, gs := range plan.ExpertGPUs(l) {
				if len(gs) > 1 {
					assert.True(t, slicesEqualGPU(gs, res.Copies[l][e]), "instance %d layer %d expert %d: a replicated expert's copies moved", it, l, e)
				}
			}
			before := newStateKappa(buildLayer(p, shBefore, l), int32Copies(plan.ExpertGPUs(l)), 0)
			after := newStateKappa(buildLayer(q, shAfter, l), int32Copies(res.Copies[l]), 0)
			assert.LessOrEqual(t, after.costNow(levelGPU), before.costNow(levelGPU)*(1+1e-12), "instance %d layer %d", it, l)
			runs++
			if after.imbalance(levelGPU) < before.imbalance(levelGPU)*(1-1e-9) {
				better++
			}
		}
	}
	assert.Greater(t, better, runs/2, "layers balanced better as dealt")
	t.Logf("%d of %d layers balanced better as dealt", better, runs)
}

// TestRepairDealtKeepsMoveBudget: from a running plan under a move budget
// the repair changes at most MaxMoves slots of each layer (its packing,
// which would move many, is off; its swaps are counted), where without
// the budget it changes more.
func TestRepairDealtKeepsMoveBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(73, 11))
	wanted := 0
	for it := range 6 {
		N, P := 2, 3+rng.IntN(2)
		E, K := 12+rng.IntN(8), 2+rng.IntN(2)
		red := fillSlots(E, N*P, N*P)
		sc, run, slots := randomInstance(t, rng, N, P, E, K, 3, 150+rng.IntN(100), red, placement.DispatchSGLangStaticNarrow, false)
		G := N * P
		for _, k := range []int{0, 1} {
			p := Problem{Scenario: sc, Slots: slots, Start: run}
			if k > 0 {
				p.Current, p.MaxMoves = run, k
			}
			res := &Result{Copies: make([][][]placement.GPU, len(run.Layers)), Remote: make([]float64, len(run.Layers))}
			for l := range run.Layers {
				res.Copies[l] = run.ExpertGPUs(l)
			}
			repairDealt(context.Background(), p, res, Options{Parallel: 2})
			checkPlan(t, res.Copies, E, slots)
			for l := range res.Copies {
				n := layerChanged(run, l, G, res.Copies[l])
				if k == 0 {
					if n > 1 {
						wanted++
					}
					continue
				}
				assert.LessOrEqual(t, n, k, "instance %d layer %d", it, l)
			}
		}
	}
	assert.Positive(t, wanted, "without a budget the repair changes more than one slot of some layer")
}
