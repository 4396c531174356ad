package replay

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// TestWorkloadFollowsDispatch: under every per-source dispatch the
// replayed tokens per GPU are the cost model's (which a token-by-token
// recount checks in costmodel), within the rounding of each expert's
// tokens to whole ones; under SGLang's table they differ from the even
// split's.
func TestWorkloadFollowsDispatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	const G, P, E, K, L, S, T = 4, 2, 6, 2, 2, 2, 400
	tr := &routing.Trace{Tokens: T, Layers: L, TopK: K, Experts: E, Source: make([]int32, T)}
	for tok := range T {
		h := rng.IntN(G)
		tr.Source[tok] = int32(h)
		for range L {
			a := (h + rng.IntN(2)) % E
			if rng.IntN(3) == 0 {
				a = rng.IntN(E)
			}
			b := (a + 1 + rng.IntN(E-1)) % E
			tr.IDs = append(tr.IDs, int16(a), int16(b))
		}
	}
	require.NoError(t, tr.Validate())
	plan := &placement.Plan{GPUs: G, Experts: E}
	for range L {
		var lp placement.LayerPlan
		perm := rng.Perm(G)
		for p := range G * S {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(p%E))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(perm[p/S]))
		}
		plan.Layers = append(plan.Layers, lp)
	}
	require.NoError(t, plan.Validate(placement.ValidateOptions{}))
	m := costmodel.Model{Name: "m", Layers: L, Experts: E, TopK: K, Hidden: 8, FFN: 8, BytesPerActivation: 2}
	c := costmodel.Cluster{Name: "c", Nodes: G / P, GPUsPerNode: P, NVLinkGBps: 900, NICGbps: 400, TokenCost: 1, ExpertCost: 1}
	differs := false
	for _, d := range []placement.Dispatch{placement.DispatchSGLangStatic, placement.DispatchSGLangStaticNarrow, placement.DispatchSGLangDynamic, placement.DispatchStaticMean} {
		w, err := NewWorkload(plan, Input{Trace: tr}, WorkloadOptions{Dispatch: d, GPUsPerNode: P})
		require.NoError(t, err, "%v", d)
		rep, err := costmodel.Evaluate(plan, tr.Stats(routing.StatsOptions{}), c, m, costmodel.Options{Dispatch: d})
		require.NoError(t, err)
		even, err := costmodel.Evaluate(plan, tr.Stats(routing.StatsOptions{}), c, m, costmodel.Options{})
		require.NoError(t, err)
		for l := range L {
			got := make([]float64, G)
			for s, n := range w.SlotTokens[0][l] {
				got[plan.Layers[l].SlotGPU[s]] += float64(n)
			}
			for g := range G {
				assert.InDelta(t, rep.Layers[l].Tokens[g], got[g], float64(E), "%v layer %d GPU %d", d, l, g)
				if d == placement.DispatchSGLangStatic && math.Abs(even.Layers[l].Tokens[g]-got[g]) > float64(E) {
					differs = true
				}
			}
		}
	}
	assert.True(t, differs, "SGLang's table is not the even split")
}

// vllmRecount counts, token by token, the tokens vLLM's hash sends to
// every GPU in layer l of one batch of plan, written without routing's or
// costmodel's code: a token's row is its index among its rank's tokens of
// its step in the batch, modulo pass when pass > 0; its copy is
// VLLMReplica(row, copies) among the expert's slots in ascending physical
// id (GPU by GPU, a GPU's slots in slot order: Plan.GPUMajor).
func vllmRecount(bt *routing.Trace, plan *placement.Plan, l, pass int) []int {
	lp := plan.Layers[l]
	copies := make([][]int, plan.Experts)
	for g := range plan.GPUs {
		for s, e := range lp.SlotExpert {
			if int(lp.SlotGPU[s]) == g {
				copies[e] = append(copies[e], s)
			}
		}
	}
	out := make([]int, plan.GPUs)
	for tok, r := range bt.Source {
		row := 0
		for u := range tok {
			if bt.Source[u] == r && (bt.Step == nil || bt.Step[u] == bt.Step[tok]) {
				row++
			}
		}
		if pass > 0 {
			row %= pass
		}
		for k := range bt.TopK {
			cs := copies[bt.At(tok, l, k)]
			out[lp.SlotGPU[cs[stackdispatch.VLLMReplica(int64(row), len(cs))]]]++
		}
	}
	return out
}

// TestWorkloadCountsVLLMHash: under vllm dispatch a trace with source
// ranks is replayed with every GPU's routed tokens, batch by batch, equal
// to vLLM's hash recounted token by token (vllmRecount), on plans whose
// slots are not GPU-major and whose experts have up to three copies, with and without steps and --pass-tokens; the modeled
// communication sees the same loads (Evaluate on the batch's statistics).
// The even split, the expectation, differs: a workload that kept it fails.
func TestWorkloadCountsVLLMHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 1))
	const G, E, K, L, T = 4, 6, 2, 2, 240
	m := costmodel.Model{Name: "m", Layers: L, Experts: E, TopK: K, Hidden: 8, FFN: 8, BytesPerActivation: 2}
	c := costmodel.Cluster{Name: "c", Nodes: 2, GPUsPerNode: 2, NVLinkGBps: 900, NICGbps: 400, TokenCost: 1, ExpertCost: 1}
	for _, tc := range []struct {
		name         string
		steps        bool
		batch, iters int
		pass         int
	}{
		{name: "whole trace"},
		{name: "batches", batch: 100},
		{name: "batches, passes of 7", batch: 80, pass: 7},
		{name: "steps", steps: true, batch: 120},
	} {
		tr := &routing.Trace{Tokens: T, Layers: L, TopK: K, Experts: E, Source: make([]int32, T)}
		if tc.steps {
			tr.Step = make([]int32, T)
		}
		for tok := range T {
			tr.Source[tok] = int32(rng.IntN(G))
			if tc.steps {
				tr.Step[tok] = int32(tok / 50)
			}
			for range L {
				a := rng.IntN(E)
				tr.IDs = append(tr.IDs, int16(a), int16((a+1+rng.IntN(E-1))%E))
			}
		}
		require.NoError(t, tr.Validate())
		// 12 slots, 3 per GPU: experts 0-3 have two copies, 4 three, the
		// GPUs relabelled at random, so that the slots are not GPU-major
		// and the copies' slot order is not their physical order.
		plan := &placement.Plan{GPUs: G, Experts: E}
		for range L {
			var lp placement.LayerPlan
			perm := rng.Perm(G)
			for s, e := range []int{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5} {
				lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
				lp.SlotGPU = append(lp.SlotGPU, placement.GPU(perm[[]int{2, 1, 3, 0, 0, 2, 1, 3, 3, 1, 0, 2}[s]]))
			}
			plan.Layers = append(plan.Layers, lp)
		}
		require.NoError(t, plan.Validate(placement.ValidateOptions{}), tc.name)
		opts := WorkloadOptions{Dispatch: placement.DispatchVLLM, BatchTokens: tc.batch, PassTokens: tc.pass}
		w, err := NewWorkload(plan, Input{Trace: tr}, opts)
		require.NoError(t, err, tc.name)
		require.True(t, w.CountsHash, "%s: %v", tc.name, w.HashErr)
		opts.Dispatch = placement.DispatchEven
		even, err := NewWorkload(plan, Input{Trace: tr}, opts)
		require.NoError(t, err)
		b := cmp.Or(tc.batch, T)
		require.Equal(t, T/b, w.Iterations(), tc.name)
		differs := false
		for i := range w.Iterations() {
			bt := tr.Slice(i*b, (i+1)*b)
			rep, err := costmodel.Evaluate(plan, w.Stats[i], c, m, costmodel.Options{Dispatch: placement.DispatchVLLM})
			require.NoError(t, err)
			for l := range L {
				want := vllmRecount(bt, plan, l, tc.pass)
				assert.Equal(t, want, w.GPUTokens(i, l), "%s: batch %d layer %d", tc.name, i, l)
				for g, n := range want {
					assert.InDelta(t, float64(n), rep.Layers[l].Tokens[g], 1e-9, "%s: modeled communication's loads, batch %d layer %d GPU %d", tc.name, i, l, g)
				}
				differs = differs || !slices.Equal(want, even.GPUTokens(i, l))
			}
		}
		assert.True(t, differs, "%s: the hash is not the even split here", tc.name)
	}
}

// TestWorkloadVLLMHashFallsBack: without source ranks, in chain flow, or
// with a source rank beyond the plan's GPUs, vllm dispatch replays the even
// split and says why; tokens of unknown source in a trace with sources take
// the even split of their expert's slots, every token still counted once.
// A plan's slot shares, which the hash overrides, and a negative pass size
// are errors.
func TestWorkloadVLLMHashFallsBack(t *testing.T) {
	tr := &routing.Trace{Tokens: 4, Layers: 1, TopK: 1, Experts: 2, IDs: []int16{0, 0, 0, 1}, Source: []int32{0, -1, -1, 1}}
	require.NoError(t, tr.Validate())
	plan := &placement.Plan{GPUs: 2, Experts: 2, Layers: []placement.LayerPlan{{
		SlotExpert: []routing.Expert{0, 0, 1}, SlotGPU: []placement.GPU{0, 1, 1}}}}
	require.NoError(t, plan.Validate(placement.ValidateOptions{}))
	vllm := WorkloadOptions{Dispatch: placement.DispatchVLLM}
	w, err := NewWorkload(plan, Input{Trace: tr}, vllm)
	require.NoError(t, err)
	require.True(t, w.CountsHash, "%v", w.HashErr)
	// Rank 0's row 0 goes to copy 0 (GPU 0); the two unknown tokens split
	// evenly over expert 0's slots.
	assert.Equal(t, []int{2, 1, 1}, w.SlotTokens[0][0])

	noSrc := *tr
	noSrc.Source = nil
	chain := vllm
	chain.Flow = costmodel.FlowChain
	far := *tr
	far.Source = []int32{0, 2, 0, 1}
	for name, in := range map[string]struct {
		tr   *routing.Trace
		opts WorkloadOptions
	}{
		"no sources":       {&noSrc, vllm},
		"chain flow":       {tr, chain},
		"rank beyond GPUs": {&far, vllm},
	} {
		w, err := NewWorkload(plan, Input{Trace: in.tr}, in.opts)
		require.NoError(t, err, name)
		assert.False(t, w.CountsHash, name)
		assert.Error(t, w.HashErr, name)
		assert.Nil(t, w.Stats[0].Order, name)
		assert.Equal(t, []int{2, 1, 1}, w.SlotTokens[0][0], name)
	}
	_, err = NewWorkload(plan, Input{Trace: tr}, WorkloadOptions{Dispatch: placement.DispatchVLLM, PassTokens: -1})
	assert.Error(t, err)
	shared := plan.Clone()
	shared.Layers[0].SlotShare = []float64{0.5, 0.5, 1}
	_, err = NewWorkload(shared, Input{Trace: tr}, vllm)
	assert.ErrorContains(t, err, "vllm dispatch decides the split")
}
