package costmodel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

var dealt = []placement.Dispatch{placement.DispatchSGLangStatic, placement.DispatchSGLangStaticNode, placement.DispatchSGLangStaticNarrow, placement.DispatchSGLangStaticGPUOnly}

// dealInstance is a GPU-major plan with S slots on each of G GPUs (every
// expert at least once, the rest copies of random experts, some on one GPU
// twice) and T tokens, each from a random source rank, with count 1.
func dealInstance(rng *rand.Rand, nodes, gpn, S, L, E, K, T int) (*placement.Plan, *routing.Stats, [][]int16, []int32) {
	G := nodes * gpn
	plan := &placement.Plan{GPUs: G, Experts: E}
	for range L {
		phy := rng.Perm(G * S)
		var lp placement.LayerPlan
		for p := range G * S {
			e := phy[p]
			if e >= E {
				e = rng.IntN(E)
			}
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(p/S))
		}
		plan.Layers = append(plan.Layers, lp)
	}
	var pats []pat
	src := make([]int32, T)
	sets := make([][]int16, 0, T)
	for t := range T {
		src[t] = int32(rng.IntN(G))
		s := randomSets(rng, L, E, K)
		pats = append(pats, pat{src: src[t], count: 1, sets: s})
		flat := make([]int16, 0, L*K)
		for _, x := range s {
			flat = append(flat, x...)
		}
		sets = append(sets, flat)
	}
	return plan, patternStats(L, E, K, pats), sets, src
}

// TestDealtLoadsMatchRecount: under every tree of SGLang's static table,
// Evaluate's routed tokens per GPU equal a token-by-token recount through
// the table SGLang builds (stackdispatch.SGLangStaticTable, checked against
// Python's random elsewhere), in every layer. The expectation model
// (static-mean) misses it on most instances.
func TestDealtLoadsMatchRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	missed, tried := 0, 0
	for it := range 24 {
		nodes, gpn, S := 1+it%3, 2+it%2, 2+it%3
		G := nodes * gpn
		E := G*S - 1 - rng.IntN(G)
		L, K := 1+it%3, 1+rng.IntN(min(3, E))
		plan, st, sets, src := dealInstance(rng, nodes, gpn, S, L, E, K, 40+rng.IntN(60))
		c := tinyCluster(nodes, gpn)
		m := tinyModel(L, E, K)
		for _, d := range dealt {
			name := fmt.Sprintf("it%d/%dx%d/S%d/%v", it, nodes, gpn, S, d)
			rep, err := Scenario{Stats: st, Cluster: c, Model: m, Dispatch: d}.Evaluate(plan)
			require.NoError(t, err, name)
			v, _ := sglangVariant(d)
			phy := make([][]int32, L)
			for l, lp := range plan.Layers {
				for _, e := range lp.SlotExpert {
					phy[l] = append(phy[l], int32(e))
				}
			}
			cands, err := stackdispatch.CandidatesFromPhy2Log(phy, E)
			require.NoError(t, err)
			table, err := stackdispatch.SGLangStaticTable(cands, G, S, gpn, v, stackdispatch.SGLangInitByMapping)
			require.NoError(t, err)
			for l := range L {
				rt := stackdispatch.Routing{TopK: K, Source: src}
				for _, s := range sets {
					for _, e := range s[l*K : (l+1)*K] {
						rt.Experts = append(rt.Experts, int32(e))
					}
				}
				want, err := stackdispatch.CountTokens(rt, S, G, stackdispatch.StaticPicker(table, l))
				require.NoError(t, err)
				for g := range G {
					require.InDelta(t, float64(want[g]), rep.Layers[l].Tokens[g], 1e-9, "%s layer %d GPU %d", name, l, g)
				}
			}
			mean, err := Scenario{Stats: st, Cluster: c, Model: m, Dispatch: placement.DispatchStaticMean}.Evaluate(plan)
			require.NoError(t, err)
			tried++
			if math.Abs(mean.MaxTokensSum-rep.MaxTokensSum) > 1e-6 {
				missed++
			}
		}
	}
	t.Logf("the expectation's busiest GPUs differ from the deal's in %d of %d", missed, tried)
	assert.Greater(t, missed, tried/3)
}

// TestEvaluatorDealtMoves: under SGLang's tables the incremental
// evaluator's deltas equal a fresh Evaluate, both for swaps (the stream
// stays) and for retargets (a copy count changes, the stream moves and the
// evaluator rebinds the whole deal).
func TestEvaluatorDealtMoves(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	checked, global := 0, 0
	for it := range 16 {
		nodes, gpn, S := 1+it%2, 2+it%3, 2+it%2
		G := nodes * gpn
		E := G*S - 1 - rng.IntN(G)
		L, K := 1+it%3, 1+rng.IntN(2)
		plan, st, _, _ := dealInstance(rng, nodes, gpn, S, L, E, K, 60)
		for _, d := range dealt {
			sc := Scenario{Stats: st, Cluster: tinyCluster(nodes, gpn), Model: tinyModel(L, E, K), Dispatch: d, Mode: Mode(it % 2)}
			name := fmt.Sprintf("it%d/%v", it, d)
			ev, err := sc.NewEvaluator(plan)
			require.NoError(t, err, name)
			cur := plan.Clone()
			base, err := sc.Evaluate(cur)
			require.NoError(t, err)
			for range 20 {
				l := rng.IntN(L)
				lp := cur.Layers[l]
				mv := Move{Kind: MoveSwap, Layer: l, Slot: rng.IntN(len(lp.SlotGPU)), Other: rng.IntN(len(lp.SlotGPU))}
				if rng.IntN(3) == 0 {
					mv = Move{Kind: MoveRetarget, Layer: l, Slot: rng.IntN(len(lp.SlotGPU)), Expert: routing.Expert(rng.IntN(E))}
				}
				next := applied(cur, mv)
				rep, err2 := sc.Evaluate(next)
				dl, err := ev.Delta(mv)
				if err2 != nil {
					require.Error(t, err, "%s %+v", name, mv)
					continue
				}
				require.NoError(t, err, "%s %+v", name, mv)
				require.InDelta(t, rep.TimeSec-base.TimeSec, dl, 1e-9*base.TimeSec, "%s %+v", name, mv)
				tt, err := ev.TrialTokens(mv)
				require.NoError(t, err)
				require.InDeltaSlice(t, rep.Layers[l].Tokens, tt, 1e-9, "%s %+v", name, mv)
				if ev.trial.global {
					global++
				}
				checked++
				if rng.IntN(2) == 0 {
					require.NoError(t, ev.Apply(mv))
					cur, base = next, rep
					require.InDelta(t, base.TimeSec, ev.Cost(), 1e-9*base.TimeSec, "%s after %+v", name, mv)
				}
			}
		}
	}
	t.Logf("%d deltas checked, %d through a rebound deal", checked, global)
	require.Greater(t, checked, 800)
	require.Greater(t, global, 20)
}

// TestDealSplitRefusesUnequalSlots: SGLang numbers physical experts GPU by
// GPU, so a plan with different slot counts per GPU cannot be dealt.
func TestDealSplitRefusesUnequalSlots(t *testing.T) {
	plan := &placement.Plan{GPUs: 2, Experts: 3, Layers: []placement.LayerPlan{{SlotExpert: []routing.Expert{0, 1, 2}, SlotGPU: []placement.GPU{0, 0, 1}}}}
	_, err := NewSplitter(placement.DispatchSGLangStatic, plan, 2, 2, placement.Layout{})
	assert.ErrorContains(t, err, "same count on every GPU")
}
