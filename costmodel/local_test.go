package costmodel

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// TestEvaluatorLocal: a move Local reports is priced on its own layer
// leaves every other layer's tokens as they were (recounted by a full
// Evaluate of the moved plan), under SGLang's tables too, where a move
// that shifts the deal's random stream changes the layers after it. Under
// the even split every move is local; under the tables both kinds occur.
// A Local that called every move local fails on the moves that re-deal.
func TestEvaluatorLocal(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	local := map[placement.Dispatch]int{}
	global := map[placement.Dispatch]int{}
	for it := 0; it < 80; it++ {
		_, st, m := randomInstance(rng, 2, 2+rng.IntN(2), true)
		if st.Layers < 2 {
			continue
		}
		G := 2 * (2 + rng.IntN(2))
		plan := evenSlotsPlan(rng, st.Layers, st.Experts, G, (st.Experts+G-1)/G+1)
		c := tinyCluster(2, G/2)
		for _, d := range []placement.Dispatch{placement.DispatchEven, placement.DispatchSGLangStatic, placement.DispatchSGLangStaticNarrow} {
			sc := Scenario{Stats: st, Cluster: c, Model: m, Flow: FlowHome, Dispatch: d}
			ev, err := sc.NewEvaluator(plan)
			if err != nil {
				continue // unequal slots per GPU: SGLang's tables refuse them
			}
			base, err := sc.Evaluate(plan)
			require.NoError(t, err)
			for k := 0; k < 10; k++ {
				l := rng.IntN(len(plan.Layers))
				mv := randomMove(rng, l, plan.Layers[l], plan.GPUs, plan.Experts, true)
				if mv.Kind != MoveSwap && mv.Kind != MoveRetarget {
					continue
				}
				loc, err := ev.Local(mv)
				rep, err2 := sc.Evaluate(applied(plan, mv))
				if err != nil || err2 != nil {
					continue
				}
				name := fmt.Sprintf("it%d/%v/%+v", it, d, mv)
				if !loc {
					global[d]++
					continue
				}
				local[d]++
				for i := range rep.Layers {
					if i != l {
						require.InDeltaSlice(t, base.Layers[i].Tokens, rep.Layers[i].Tokens, 1e-9, "%s: layer %d", name, i)
					}
				}
			}
		}
	}
	t.Logf("local %v, global %v", local, global)
	assert.Zero(t, global[placement.DispatchEven])
	for _, d := range []placement.Dispatch{placement.DispatchSGLangStatic, placement.DispatchSGLangStaticNarrow} {
		assert.Positive(t, local[d], "%v", d)
		assert.Positive(t, global[d], "%v", d)
	}
}

// evenSlotsPlan places E experts on G GPUs with S slots each (S·G ≥ E),
// every expert once and the spare slots to random experts, never two
// copies of one expert on a GPU.
func evenSlotsPlan(rng *rand.Rand, L, E, G, S int) *placement.Plan {
	plan := &placement.Plan{GPUs: G, Experts: E}
	for range L {
		for {
			var lp placement.LayerPlan
			ok := true
			order := rng.Perm(E)
			for len(order) < G*S {
				order = append(order, rng.IntN(E))
			}
			held := map[[2]int]bool{}
			for i, e := range order {
				g := i % G
				if held[[2]int{g, e}] {
					ok = false
					break
				}
				held[[2]int{g, e}] = true
				lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
				lp.SlotGPU = append(lp.SlotGPU, placement.GPU(g))
			}
			if ok {
				plan.Layers = append(plan.Layers, lp)
				break
			}
		}
	}
	return plan
}
