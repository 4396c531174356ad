package costmodel

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// flameLike has FLAME-MoE-290M's shape: 1024 tokens, 8 layers, top-6 of 64.
func flameLike() (*placement.Plan, *routing.Stats, Model) {
	rng := rand.New(rand.NewPCG(3, 4))
	const L, E, K, G = 8, 64, 6, 8
	var pats []pat
	for i := 0; i < 1024; i++ {
		pats = append(pats, pat{src: -1, count: 1, sets: randomSets(rng, L, E, K)})
	}
	gpu := make([][]int, L)
	for l := range gpu {
		gpu[l] = make([]int, E)
		for e := range gpu[l] {
			gpu[l][e] = e * G / E
		}
	}
	m, _ := ModelPreset("flame-moe-290m")
	return singlePlan(G, gpu), patternStats(L, E, K, pats), m
}

// deepseekLike is count-only DeepSeek-V3 on 4×8 GPUs.
func deepseekLike() (*placement.Plan, *routing.Stats, Model) {
	rng := rand.New(rand.NewPCG(5, 6))
	const L, E, G = 58, 256, 32
	st := &routing.Stats{Layers: L, Experts: E, TopK: 8, Load: make([][]float64, L)}
	for l := range st.Load {
		st.Load[l] = make([]float64, E)
		for e := range st.Load[l] {
			st.Load[l][e] = float64(rng.IntN(5000))
		}
		if l+1 < L {
			r := make([]float64, E*E)
			for i := range r {
				r[i] = float64(rng.IntN(10))
			}
			st.Transitions = append(st.Transitions, r)
		}
	}
	gpu := make([][]int, L)
	for l := range gpu {
		gpu[l] = make([]int, E)
		for e := range gpu[l] {
			gpu[l][e] = e * G / E
		}
	}
	m, _ := ModelPreset("deepseek-v3")
	return singlePlan(G, gpu), st, m
}

func benchEvaluate(b *testing.B, plan *placement.Plan, st *routing.Stats, c Cluster, m Model, opts Options) {
	rep, err := Evaluate(plan, st, c, m, opts)
	require.NoError(b, err)
	for b.Loop() {
		_, _ = Evaluate(plan, st, c, m, opts)
	}
	b.ReportMetric(rep.TimeSec*1e6, "model-µs")
}

// benchSwap measures Delta of a swap of two experts in layer 1 (in chain
// flow it touches layers 1 and 2).
func benchSwap(b *testing.B, plan *placement.Plan, st *routing.Stats, c Cluster, m Model, opts Options) {
	sc := Scenario{Stats: st, Cluster: c, Model: m, Flow: opts.Flow, Mode: opts.Mode, Dispatch: opts.Dispatch}
	ev, err := sc.NewEvaluator(plan)
	require.NoError(b, err)
	S := len(plan.Layers[1].SlotGPU)
	mv := Move{Kind: MoveSwap, Layer: 1, Slot: 0, Other: S - 1}
	_, err = ev.Delta(mv)
	require.NoError(b, err)
	i := 0
	for b.Loop() {
		i++
		mv.Other = S - 1 - i%(S/2)
		_, _ = ev.Delta(mv)
	}
}

func BenchmarkEvaluateFlameChain(b *testing.B) {
	plan, st, m := flameLike()
	c, _ := ClusterPreset("h100x8")
	benchEvaluate(b, plan, st, c, m, Options{Flow: FlowChain})
}

func BenchmarkSwapFlameChain(b *testing.B) {
	plan, st, m := flameLike()
	c, _ := ClusterPreset("h100x8")
	benchSwap(b, plan, st, c, m, Options{Flow: FlowChain})
}

func BenchmarkEvaluateDeepSeekCountOnly(b *testing.B) {
	plan, st, m := deepseekLike()
	c, _ := ClusterPreset("4xh200x8")
	benchEvaluate(b, plan, st, c, m, Options{})
}

func BenchmarkSwapDeepSeekCountOnlyChain(b *testing.B) {
	plan, st, m := deepseekLike()
	c, _ := ClusterPreset("4xh200x8")
	benchSwap(b, plan, st, c, m, Options{Flow: FlowChain})
}

func TestDeltaAllocs(t *testing.T) {
	plan, st, m := flameLike()
	c, _ := ClusterPreset("2xh100x8")
	plan.GPUs = 16
	sc := Scenario{Stats: st, Cluster: c, Model: m, Flow: FlowChain, Mode: Overlapped}
	ev, err := sc.NewEvaluator(plan)
	require.NoError(t, err)
	mv := Move{Kind: MoveSwap, Layer: 1, Slot: 0, Other: 40}
	_, err = ev.Delta(mv)
	require.NoError(t, err)
	other := 40
	allocs := testing.AllocsPerRun(20, func() {
		other = 40 + (other-39)%20
		mv.Other = other
		_, _ = ev.Delta(mv)
	})
	require.Zero(t, allocs)
}

// BenchmarkStepScorerDeepSeek: StepTails of count-only DeepSeek-V3 steps
// (58 layers × 256 experts, 32 redundant slots on 4 × 8 GPUs) under even
// dispatch and SGLang's static table: bind is NewStepScorer (the deal),
// step is one step's tails on the bound plan, evaluate StepEvaluate of
// the step (an Evaluate with its own deal).
func BenchmarkStepScorerDeepSeek(b *testing.B) {
	_, st, m := deepseekLike()
	c, _ := ClusterPreset("4xh200x8")
	plan := equalSlotsPlan(rand.New(rand.NewPCG(7, 8)), 58, 256, 32, 9)
	for _, d := range []placement.Dispatch{placement.DispatchEven, placement.DispatchSGLangStatic} {
		opts := Options{Dispatch: d}
		b.Run(d.String()+"/bind", func(b *testing.B) {
			for b.Loop() {
				_, _ = NewStepScorer(plan, st.TopK, c, m, opts)
			}
		})
		b.Run(d.String()+"/step", func(b *testing.B) {
			sc, err := NewStepScorer(plan, st.TopK, c, m, opts)
			require.NoError(b, err)
			for b.Loop() {
				_, _ = sc.Tails(st.Load)
			}
		})
		b.Run(d.String()+"/evaluate", func(b *testing.B) {
			for b.Loop() {
				_, _, _ = StepEvaluate(plan, st.Load, st.TopK, c, m, opts)
			}
		})
	}
}
