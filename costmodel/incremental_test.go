package costmodel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// randomMove draws a move for lp: swaps always, the other kinds only when
// replicate (they change copy counts).
func randomMove(rng *rand.Rand, l int, lp placement.LayerPlan, G, E int, replicate bool) Move {
	S := len(lp.SlotExpert)
	kinds := []MoveKind{MoveSwap}
	if replicate {
		kinds = append(kinds, MoveRelocate, MoveRetarget, MoveAdd, MoveDrop)
	}
	m := Move{Kind: kinds[rng.IntN(len(kinds))], Layer: l, Slot: rng.IntN(S), Other: rng.IntN(S)}
	m.GPU = placement.GPU(rng.IntN(G))
	m.Expert = routing.Expert(rng.IntN(E))
	return m
}

// applied returns a copy of plan with m applied the slow way.
func applied(plan *placement.Plan, m Move) *placement.Plan {
	q := plan.Clone()
	lp := &q.Layers[m.Layer]
	switch m.Kind {
	case MoveSwap:
		lp.SlotGPU[m.Slot], lp.SlotGPU[m.Other] = lp.SlotGPU[m.Other], lp.SlotGPU[m.Slot]
	case MoveRelocate:
		lp.SlotGPU[m.Slot] = m.GPU
	case MoveRetarget:
		lp.SlotExpert[m.Slot] = m.Expert
	case MoveAdd:
		lp.SlotExpert = append(lp.SlotExpert, m.Expert)
		lp.SlotGPU = append(lp.SlotGPU, m.GPU)
	case MoveDrop:
		last := len(lp.SlotExpert) - 1
		lp.SlotExpert[m.Slot], lp.SlotGPU[m.Slot] = lp.SlotExpert[last], lp.SlotGPU[last]
		lp.SlotExpert, lp.SlotGPU = lp.SlotExpert[:last], lp.SlotGPU[:last]
	}
	return q
}

// TestEvaluatorRandomMoves applies thousands of random moves on random
// instances, for every flow × dispatch × topology × replication × kind of
// statistics (per-token patterns with known, unknown and mixed sources;
// count-only), and checks every Delta against the difference of two full
// Evaluates, and the running Cost after every applied move. It catches an
// incremental update that forgets a term: the transition into layer l+1
// in chain flow, the combine's home masses of chain flow's last layer, the
// tokens or the per-source splits of a replicated expert, the sources of
// a pattern, or a sign.
func TestEvaluatorRandomMoves(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	shapes := []struct{ nodes, gpn int }{{1, 2}, {1, 4}, {2, 2}, {2, 3}, {3, 2}}
	type combo struct {
		flow     Flow
		dispatch placement.Dispatch
	}
	combos := []combo{
		{FlowHome, placement.DispatchEven}, {FlowChain, placement.DispatchEven},
		{FlowHome, placement.DispatchLocal}, {FlowHome, placement.DispatchStaticMean},
	}
	moves, checked := 0, 0
	for it := 0; it < 60; it++ {
		sh := shapes[it%len(shapes)]
		for _, replicate := range []bool{false, true} {
			plan, st, m := randomInstance(rng, sh.nodes, sh.gpn, replicate)
			c := tinyCluster(sh.nodes, sh.gpn)
			for _, cb := range combos {
				for _, counts := range []bool{false, true} {
					s := st
					if counts {
						s = countOnly(st)
					}
					sc := Scenario{Stats: s, Cluster: c, Model: m, Flow: cb.flow, Mode: Mode(it % 2), Dispatch: cb.dispatch}
					name := fmt.Sprintf("it%d/%dx%d/rep=%v/%v/%v/countonly=%v", it, sh.nodes, sh.gpn, replicate, cb.flow, cb.dispatch, counts)
					ev, err := sc.NewEvaluator(plan)
					require.NoError(t, err, name)
					cur := plan.Clone()
					base, err := sc.Evaluate(cur)
					require.NoError(t, err, name)
					for k := 0; k < 12; k++ {
						l := rng.IntN(len(cur.Layers))
						mv := randomMove(rng, l, cur.Layers[l], cur.GPUs, cur.Experts, replicate)
						next := applied(cur, mv)
						tt, errT := ev.TrialTokens(mv) // before Delta: its own path, not Delta's cache
						d, err := ev.Delta(mv)
						rep, err2 := sc.Evaluate(next)
						moves++
						if err2 != nil {
							// The move leaves an expert without a copy: the
							// evaluator must refuse it too.
							require.Error(t, err, "%s: %+v", name, mv)
							require.Error(t, errT, "%s: %+v", name, mv)
							continue
						}
						require.NoError(t, err, "%s: %+v", name, mv)
						want := rep.TimeSec - base.TimeSec
						require.InDelta(t, want, d, 1e-9*math.Max(1e-6, base.TimeSec), "%s: delta of %+v", name, mv)
						require.NoError(t, errT, name)
						require.InDeltaSlice(t, rep.Layers[l].Tokens, tt, 1e-9*math.Max(1, rep.Layers[l].MaxTokens), "%s: trial tokens of %+v", name, mv)
						checked++
						if rng.IntN(2) == 0 {
							require.NoError(t, ev.Apply(mv))
							cur, base = next, rep
							require.InDelta(t, base.TimeSec, ev.Cost(), 1e-9*base.TimeSec, "%s: cost after %+v", name, mv)
							for i := range rep.Layers {
								require.InDelta(t, rep.Layers[i].TimeSec, ev.LayerCost(i), 1e-9*base.TimeSec, "%s: layer %d", name, i)
							}
							require.True(t, cur.Equal(ev.Plan()), name)
						}
					}
					ev.Resync()
					require.InDelta(t, base.TimeSec, ev.Cost(), 1e-12*base.TimeSec, name)
				}
			}
		}
	}
	t.Logf("%d moves, %d deltas checked", moves, checked)
	require.Greater(t, checked, 4000)
}

// TestEvaluatorLongRun applies many moves to one larger instance and checks
// the accumulated counters still match a fresh evaluation.
func TestEvaluatorLongRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	plan, st, m := randomInstance(rng, 2, 3, true)
	for _, flow := range []Flow{FlowHome, FlowChain} {
		sc := Scenario{Stats: st, Cluster: tinyCluster(2, 3), Model: m, Flow: flow}
		ev, err := sc.NewEvaluator(plan)
		require.NoError(t, err)
		applied := 0
		for k := 0; k < 3000; k++ {
			l := rng.IntN(len(plan.Layers))
			mv := randomMove(rng, l, ev.Layer(l), plan.GPUs, plan.Experts, true)
			if ev.Apply(mv) == nil {
				applied++
			}
		}
		rep, err := sc.Evaluate(ev.Plan())
		require.NoError(t, err)
		require.InDelta(t, rep.TimeSec, ev.Cost(), 1e-9*rep.TimeSec, "%v after %d moves", flow, applied)
		require.Greater(t, applied, 1000)
	}
}
