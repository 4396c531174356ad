package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// TestSearchCountsVLLMHash: under vLLM's dispatch with the trace's token
// order attached (the cost model then counts the hash token by token), the
// home-flow search plans on the counted hash: for the plan it returns, the
// state it scores each layer with holds the cost model's per-GPU tokens
// (to 1e-9), NIC ports and remote-node copies, and so it does after random
// moves, every tried delta the applied change. The same state on the even
// split, vLLM's expectation and what the search planned on before it was
// given the scenario's splitter, misses Evaluate's tokens on most layers:
// the test tells the two apart.
func TestSearchCountsVLLMHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 7))
	checked, differs := 0, 0
	for it := range 8 {
		N, P := 2, 2+it%2
		G := N * P
		E, K := 6+rng.IntN(6), 2+rng.IntN(2)
		red := fillSlots(E, G, G) // replicas, whose split is the hash's
		B := []int{0, 3, 8}[it%3]
		t.Run(fmt.Sprintf("%d-N%dP%dE%dK%dR%dB%d", it, N, P, E, K, red, B), func(t *testing.T) {
			sc, plan, slots, tr := randomTraceInstance(t, rng, N, P, E, K, 2, 60+rng.IntN(60), red, placement.DispatchVLLM, false)
			sc.Mode = costmodel.Sequential
			var err error
			sc.Stats.Order, err = tr.TokenOrder(B)
			require.NoError(t, err)
			require.NoError(t, costmodel.HashOrder(sc.Stats, G))
			require.True(t, sc.PerSource(), "the counted hash splits per source")
			p := Problem{Scenario: sc, Slots: slots, Start: plan}
			res, err := Solve(context.Background(), p, Options{Limit: task.Limit{Work: 2000}, Parallel: 2, Shares: Shares{Proxy: 0.3, Nodes: 0.25, GPUs: 0.15}})
			require.NoError(t, err)
			checkPlan(t, res.Copies, E, slots)
			rep, err := sc.Evaluate(placement.FromReplicas(G, res.Copies, "affinity"))
			require.NoError(t, err)

			sh, err := newShape(p)
			require.NoError(t, err)
			// What the search planned on before: the statistics without
			// their order, so vLLM's expectation, the even split.
			noOrder := *sc.Stats
			noOrder.Order = nil
			pe := p
			pe.Stats = &noOrder
			shEven, err := newShape(pe)
			require.NoError(t, err)
			for l := range res.Copies {
				s := newState(buildLayer(p, sh, l), int32Copies(res.Copies[l]))
				require.InDeltaSlice(t, rep.Layers[l].Tokens, s.tok, 1e-9, "layer %d: the search's tokens per GPU vs Evaluate's", l)
				se := newState(buildLayer(pe, shEven, l), int32Copies(res.Copies[l]))
				checked++
				for g := range G {
					if d := se.tok[g] - rep.Layers[l].Tokens[g]; math.Abs(d) > 1e-6 {
						differs++
						break
					}
				}
				// The whole state, before and after random moves (the
				// same copies in every layer of the plan it evaluates).
				s = newState(buildLayer(p, sh, l), int32Copies(res.Copies[l]))
				checkAgainstModel(t, sc, s, l)
				for range 40 {
					if !tryApply(t, rng, s) {
						break
					}
				}
				checkAgainstModel(t, sc, s, l)
			}
		})
	}
	t.Logf("%d layers checked, the even split off Evaluate's tokens on %d", checked, differs)
	assert.Greater(t, differs, checked/2, "the hash must differ from the even split on most layers, or the test proves nothing")
}
