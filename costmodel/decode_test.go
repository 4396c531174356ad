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

// TestActivatedExpertsHand: 2 GPUs, experts 0 and 1 on GPU 0, expert 2 on
// both GPUs (two copies), expert 3 on GPU 1. Catches counting held slots
// instead of activated copies, and ignoring the split over copies.
func TestActivatedExpertsHand(t *testing.T) {
	lp := placement.LayerPlan{
		SlotExpert: []routing.Expert{0, 1, 2, 2, 3},
		SlotGPU:    []placement.GPU{0, 0, 0, 1, 1},
	}
	cases := []struct {
		name string
		load []float64
		want []float64
	}{
		{"all hot", []float64{5, 3, 4, 1}, []float64{3, 2}},
		{"cold single copies", []float64{0, 7, 4, 0}, []float64{2, 1}},
		// One token for a two-copy expert: each copy serves it with
		// probability 1/2.
		{"one token two copies", []float64{0, 0, 1, 0}, []float64{0.5, 0.5}},
		{"nothing", []float64{0, 0, 0, 0}, []float64{0, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ActivatedExperts(lp, 2, c.load)
			require.Len(t, got, 2)
			for g := range got {
				assert.InDelta(t, c.want[g], got[g], 1e-12, "GPU %d", g)
			}
		})
	}
	// Shares (a dispatch-time split): expert 2's one token goes to the
	// copy on GPU 0 with probability 0.9.
	lp.SlotShare = []float64{1, 1, 0.9, 0.1, 1}
	got := ActivatedExperts(lp, 2, []float64{0, 0, 1, 0})
	assert.InDelta(t, 0.9, got[0], 1e-12)
	assert.InDelta(t, 0.1, got[1], 1e-12)
}

// TestStepComputeDecodeBalance: the same token counts per GPU, but GPU 1's
// tokens are spread over more experts: it reads more weights and is the
// tail. A token-only model would call the two GPUs equal.
func TestStepComputeDecodeBalance(t *testing.T) {
	c := tinyCluster(1, 2) // 1 µs per token, 10 µs per expert
	m := tinyModel(1, 4, 1)
	lp := placement.LayerPlan{SlotExpert: []routing.Expert{0, 1, 2, 3}, SlotGPU: []placement.GPU{0, 0, 1, 1}}
	per, tail := StepCompute(lp, []float64{4, 0, 2, 2}, c, m)
	assert.InDelta(t, 4e-6+10e-6, per[0], 1e-15)
	assert.InDelta(t, 4e-6+20e-6, per[1], 1e-15)
	assert.InDelta(t, 24e-6, tail, 1e-15)
}

// TestStepTimeMatchesEvaluateWhenAllActive: with every copy receiving at
// least as many tokens as the expert has copies (a prefill step), the
// activated-expert model is Evaluate's, in both modes, on random
// replicated instances. Catches a per-step time that drifts from the cost
// model it refines (wrong combination of phases, σ, chunks).
func TestStepTimeMatchesEvaluateWhenAllActive(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		nodes, gpn := 1+rng.IntN(2), 1+rng.IntN(3)
		plan, st, m := randomInstance(rng, nodes, gpn, true)
		load := make([][]float64, st.Layers)
		for l := range load {
			load[l] = make([]float64, st.Experts)
			for e := range load[l] {
				load[l][e] = float64(2 + rng.IntN(20)) // ≥ 2 copies' worth
			}
		}
		for _, mode := range []Mode{Sequential, Overlapped} {
			c := tinyCluster(nodes, gpn)
			opts := Options{Mode: mode}
			got, err := StepTime(plan, load, st.TopK, c, m, opts)
			require.NoError(t, err, "instance %d", i)
			rep, err := Evaluate(plan, routing.StatsFromLoad(load, st.TopK), c, m, opts)
			require.NoError(t, err)
			assert.InDelta(t, rep.TimeSec, got, 1e-9*math.Max(1, rep.TimeSec)+2e-9*float64(st.Layers), "instance %d mode %v", i, mode)
		}
	}
}

// TestStepTimeDecodeCheaper: a step that leaves copies idle costs less
// than Evaluate's every-slot charge, by exactly the idle copies' weight
// reads on the tail GPU.
func TestStepTimeDecodeCheaper(t *testing.T) {
	c := tinyCluster(1, 2)
	m := tinyModel(1, 4, 1)
	plan := singlePlan(2, [][]int{{0, 0, 1, 1}})
	load := [][]float64{{3, 0, 3, 0}}
	got, err := StepTime(plan, load, 1, c, m, Options{})
	require.NoError(t, err)
	rep, err := Evaluate(plan, routing.StatsFromLoad(load, 1), c, m, Options{})
	require.NoError(t, err)
	assert.InDelta(t, rep.TimeSec-10e-6, got, 2e-9)
}

func TestStepTimeErrors(t *testing.T) {
	c := tinyCluster(1, 2)
	m := tinyModel(1, 4, 1)
	plan := singlePlan(2, [][]int{{0, 0, 1, 1}})
	_, err := StepTime(nil, [][]float64{{1, 1, 1, 1}}, 1, c, m, Options{})
	assert.ErrorContains(t, err, "nil plan")
	_, err = StepTime(plan, [][]float64{{1, 1, 1, 1}, {1, 1, 1, 1}}, 1, c, m, Options{})
	assert.ErrorContains(t, err, "2 layers, the plan 1")
}

// TestStepTimeDealt: under SGLang's static table a step's compute tail is
// the GPUs' tokens as dealt, not the even split. 4 GPUs on one node, two
// slots each; expert 0 (400 tokens, 100 from each rank: count-only
// statistics) has copies on GPUs 0, 1 and 2, whose ranks keep their
// tokens; rank 3 sends its 100 to one copy, so that GPU computes 200 of
// expert 0 where the even split gives every copy 133⅓. A step time that
// ignored the dispatch would find a tail of 143⅓ tokens.
func TestStepTimeDealt(t *testing.T) {
	c, m, plan, load := dealtStepInstance()
	opts := Options{Flow: FlowHome, Dispatch: placement.DispatchSGLangStatic}
	sec, rep, err := StepEvaluate(plan, load, 1, c, m, opts)
	require.NoError(t, err)
	lr := rep.Layers[0]
	busiest := 0
	for g, x := range lr.Tokens {
		if x > lr.Tokens[busiest] {
			busiest = g
		}
	}
	require.Less(t, busiest, 3, "a copy of expert 0 gets rank 3's tokens")
	assert.InDelta(t, 210, lr.Tokens[busiest], 1e-9)
	tm := NewTerms(c, m, opts.Mode, opts.Chunks)
	want := tm.LayerSec(210e-6+20e-6, lr.DispatchTime.Seconds()+lr.CombineTime.Seconds(), 0)
	assert.InDelta(t, want, sec, 1e-12, "the tail as dealt")
	opts.Dispatch = placement.DispatchEven
	even, _, err := StepEvaluate(plan, load, 1, c, m, opts)
	require.NoError(t, err)
	assert.Less(t, even, sec, "the even split's tail is 143⅓ tokens")
}

// TestStepTailsHand: TestStepTimeDealt's instance, layer by layer. The
// even split gives GPUs 0–2 133⅓ of expert 0's tokens plus 10 of another
// expert; the deal gives one of them 200 plus 10.
func TestStepTailsHand(t *testing.T) {
	c, m, plan, load := dealtStepInstance()
	for _, tc := range []struct {
		d    placement.Dispatch
		want float64
	}{
		{placement.DispatchEven, (400.0/3 + 10 + 20) * 1e-6},
		{placement.DispatchSGLangStatic, (210 + 20) * 1e-6},
	} {
		t.Run(tc.d.String(), func(t *testing.T) {
			tails, err := StepTails(plan, load, 1, c, m, Options{Dispatch: tc.d})
			require.NoError(t, err)
			require.Len(t, tails, 1)
			assert.InDelta(t, tc.want, tails[0], 1e-12)
		})
	}
}

// equalSlotsPlan is a random plan of L layers with S slots on each of G
// GPUs (what SGLang's tables need): every one of E ≤ G·S experts once,
// the other slots random extra copies, shuffled.
func equalSlotsPlan(rng *rand.Rand, L, E, G, S int) *placement.Plan {
	p := &placement.Plan{GPUs: G, Experts: E}
	for range L {
		ex := make([]routing.Expert, 0, G*S)
		for e := range E {
			ex = append(ex, routing.Expert(e))
		}
		for len(ex) < G*S {
			ex = append(ex, routing.Expert(rng.IntN(E)))
		}
		rng.Shuffle(len(ex), func(i, j int) { ex[i], ex[j] = ex[j], ex[i] })
		var lp placement.LayerPlan
		for s, e := range ex {
			lp.SlotExpert = append(lp.SlotExpert, e)
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(s/S))
		}
		p.Layers = append(p.Layers, lp)
	}
	return p
}

// TestStepScorerMatchesEvaluate: on random plans and steps, under every
// dispatch, the tails of a StepScorer bound once and reused over steps are
// those of Evaluate's report of each step (recomputed here from its
// LayerReport.Tokens and ActivatedExperts, StepCompute under even
// dispatch), and they add up to StepTime's seconds with the report's
// communication.
func TestStepScorerMatchesEvaluate(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 1))
	for d := placement.Dispatch(0); d.Valid(); d++ {
		t.Run(d.String(), func(t *testing.T) {
			for trial := range 20 {
				nodes, gpn, S := 1+rng.IntN(2), 2+rng.IntN(3), 2+rng.IntN(2)
				G := nodes * gpn
				L, E, K := 1+rng.IntN(4), G*S-rng.IntN(G), 1+rng.IntN(2)
				c, m := tinyCluster(nodes, gpn), tinyModel(L, E, K)
				plan := equalSlotsPlan(rng, L, E, G, S)
				opts := Options{Dispatch: d}
				sc, err := NewStepScorer(plan, K, c, m, opts)
				require.NoError(t, err)
				for range 3 {
					load := make([][]float64, L)
					for l := range load {
						load[l] = make([]float64, E)
						for e := range load[l] {
							if rng.IntN(3) > 0 {
								load[l][e] = float64(rng.IntN(50))
							}
						}
					}
					tails, err := sc.Tails(load)
					require.NoError(t, err)
					one, err := StepTails(plan, load, K, c, m, opts)
					require.NoError(t, err)
					assert.Equal(t, one, tails, "trial %d: bound once or per step", trial)
					sec, rep, err := StepEvaluate(plan, load, K, c, m, opts)
					require.NoError(t, err)
					tm := NewTerms(c, m, Sequential, 0)
					sum := 0.0
					for l, lr := range rep.Layers {
						want := 0.0
						if d == placement.DispatchEven {
							_, want = StepCompute(plan.Layers[l], load[l], c, m)
						} else {
							act := ActivatedExperts(plan.Layers[l], G, load[l])
							for g := range G {
								want = math.Max(want, tm.Compute(g, lr.Tokens[g], act[g]))
							}
						}
						assert.InDelta(t, want, tails[l], 1e-15, "trial %d layer %d", trial, l)
						sum += tm.LayerSec(tails[l], lr.DispatchTime.Seconds()+lr.CombineTime.Seconds(), 0)
					}
					assert.InDelta(t, sec, sum, 1e-15, "trial %d: StepTime's seconds", trial)
				}
			}
		})
	}
}

// TestStepScorerErrors: the scorer rejects what StepEvaluate rejects.
func TestStepScorerErrors(t *testing.T) {
	c, m := tinyCluster(1, 2), tinyModel(1, 4, 1)
	_, err := NewStepScorer(nil, 1, c, m, Options{})
	assert.ErrorContains(t, err, "nil plan")
	plan := singlePlan(2, [][]int{{0, 0, 1, 1}})
	sc, err := NewStepScorer(plan, 1, c, m, Options{Dispatch: placement.DispatchSGLangStatic})
	require.NoError(t, err)
	_, err = sc.Tails([][]float64{{1, 1, 1, 1}, {1, 1, 1, 1}})
	assert.ErrorContains(t, err, "2 layers, the plan 1")
	_, err = sc.Tails([][]float64{{1, 1, -1, 1}})
	assert.ErrorContains(t, err, "load -1")
	_, err = NewStepScorer(plan, 1, tinyCluster(1, 4), m, Options{})
	assert.ErrorContains(t, err, "plan has 2 GPUs")
}

// dealtStepInstance is TestStepTimeDealt's instance: 4 GPUs on one node
// (1 µs per token, 10 µs per expert), two slots each, expert 0 (400
// tokens) on GPUs 0, 1 and 2, experts 1–5 (10 tokens each) on one GPU.
func dealtStepInstance() (Cluster, Model, *placement.Plan, [][]float64) {
	plan := &placement.Plan{GPUs: 4, Experts: 6, Layers: []placement.LayerPlan{{
		SlotExpert: []routing.Expert{0, 3, 0, 4, 0, 5, 1, 2},
		SlotGPU:    []placement.GPU{0, 0, 1, 1, 2, 2, 3, 3},
	}}}
	return tinyCluster(1, 4), tinyModel(1, 6, 1), plan, [][]float64{{400, 10, 10, 10, 10, 10}}
}
