package rebalance

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// tinyCluster: 1 µs per token, 10 µs per expert, NVLink 1e9 B/s and NIC
// 0.5e9 B/s per direction.
func tinyCluster(nodes, gpn int) costmodel.Cluster {
	return costmodel.Cluster{Name: "tiny", Nodes: nodes, GPUsPerNode: gpn, NVLinkGBps: 2, NICGbps: 4,
		TokenCost: time.Microsecond, ExpertCost: 10 * time.Microsecond}
}

// tinyModel has 1000-byte experts.
func tinyModel(layers, experts, k int) costmodel.Model {
	return costmodel.Model{Name: "tiny", Layers: layers, Experts: experts, TopK: k,
		Hidden: 8, FFN: 8, BytesPerActivation: 2, BytesPerExpert: 1000}
}

// planOf builds a plan from gpuExperts[l][g] = the experts on GPU g.
func planOf(G, E int, gpuExperts [][][]int) *placement.Plan {
	p := &placement.Plan{GPUs: G, Experts: E}
	for _, layer := range gpuExperts {
		var lp placement.LayerPlan
		for g, es := range layer {
			for _, e := range es {
				lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
				lp.SlotGPU = append(lp.SlotGPU, placement.GPU(g))
			}
		}
		p.Layers = append(p.Layers, lp)
	}
	return p
}

// positionsChanged counts, independently of ChangedSlots, the slots whose
// (expert, GPU) differ position by position: what a serving stack loading
// the proposed file rewrites.
func positionsChanged(a, b placement.LayerPlan) int {
	n := 0
	for s := range a.SlotExpert {
		if a.SlotExpert[s] != b.SlotExpert[s] || a.SlotGPU[s] != b.SlotGPU[s] {
			n++
		}
	}
	return n
}

// TestProposeFindsBeneficialMove: the hot experts 0 and 1 share GPU 0; one
// swap balances the layer. Catches a rebalancer that does nothing, one that
// needs more than its budget, and one that ignores the budget.
func TestProposeFindsBeneficialMove(t *testing.T) {
	cur := planOf(2, 4, [][][]int{{{0, 1}, {2, 3}}})
	load := [][]float64{{10, 10, 1, 1}}
	for _, c := range []struct {
		name     string
		budget   Budget
		wantMove int
	}{
		{"two slots", Budget{MaxMoves: 2}, 2},
		{"unbounded", Budget{}, 2},
		{"one slot is not a swap", Budget{MaxMoves: 1}, 0},
		// 10 kB over 0.5e9 B/s is 20 µs per slot; the swap saves 9 µs of
		// compute per step: it pays after three steps, not within one.
		{"pays within a long horizon", Budget{MaxMoves: 2, Horizon: 1000}, 2},
		{"does not pay within one step", Budget{MaxMoves: 2, Horizon: 1}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := tinyModel(1, 4, 1)
			m.BytesPerExpert = 10000
			r, err := New(Config{Cluster: tinyCluster(2, 1), Model: m, Initial: cur})
			require.NoError(t, err)
			for range 3 {
				require.NoError(t, r.Observe(Step{Load: load}))
			}
			prop, err := r.Propose(context.Background(), c.budget)
			require.NoError(t, err)
			require.NoError(t, prop.Plan.Validate(placement.ValidateOptions{Experts: 4, Layers: 1}))
			assert.Equal(t, c.wantMove, prop.MovedSlots)
			assert.Equal(t, c.wantMove, positionsChanged(cur.Layers[0], prop.Plan.Layers[0]))
			assert.InDelta(t, 20.0/11, prop.CurrentPAR, 1e-12)
			if c.wantMove == 0 {
				assert.Equal(t, prop.CurrentPAR, prop.PAR)
				assert.Zero(t, prop.GainSec)
				return
			}
			assert.InDelta(t, 1, prop.PAR, 1e-12)
			// 20 tokens + 2 experts → 11 tokens + 2 experts on the tail.
			assert.InDelta(t, 9e-6, prop.GainSec, 1e-12)
			assert.Equal(t, int64(20000), prop.BytesMoved)
			assert.InDelta(t, 20e-6, prop.MigrationSec, 1e-15) // one copy each way over the NICs, in parallel
			assert.False(t, prop.TimedOut)
		})
	}
}

// randomPlan is a valid plan with slots per GPU on every GPU: one copy of
// every expert, the rest copies of random experts, on distinct GPUs.
func randomPlan(rng *rand.Rand, L, E, G, per int) *placement.Plan {
	p := &placement.Plan{GPUs: G, Experts: E}
	for range L {
		for {
			slots := make([]int, 0, G*per)
			for e := range E {
				slots = append(slots, e)
			}
			for len(slots) < G*per {
				slots = append(slots, rng.IntN(E))
			}
			rng.Shuffle(len(slots), func(i, j int) { slots[i], slots[j] = slots[j], slots[i] })
			var lp placement.LayerPlan
			ok := true
			for g := range G {
				seen := map[int]bool{}
				for _, e := range slots[g*per : (g+1)*per] {
					ok = ok && !seen[e]
					seen[e] = true
					lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
					lp.SlotGPU = append(lp.SlotGPU, placement.GPU(g))
				}
			}
			if ok {
				p.Layers = append(p.Layers, lp)
				break
			}
		}
	}
	return p
}

func skewedLoad(rng *rand.Rand, L, E int) [][]float64 {
	load := make([][]float64, L)
	for l := range load {
		load[l] = make([]float64, E)
		for e := range load[l] {
			load[l][e] = float64(rng.IntN(5) * rng.IntN(5) * rng.IntN(20))
		}
	}
	return load
}

// TestProposeNeverExceedsBudget: random instances, random running plans
// with replicas, every budget from 1 to 12 slots: no layer of a proposal
// changes more slots than its budget (counted position by position, so a
// proposal whose staying copies moved to other slots fails too), the plan
// validates and keeps the slots per GPU. Catches a budget check that
// counts swaps instead of slots, a missing check after the solve, and
// broken slot alignment.
func TestProposeNeverExceedsBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	moved := 0
	for inst := range 40 {
		G := []int{2, 3, 4, 8}[rng.IntN(4)]
		E := G * (1 + rng.IntN(4))
		per := min(E, E/G+rng.IntN(3))
		L := 1 + rng.IntN(3)
		cur := randomPlan(rng, L, E, G, per)
		r, err := New(Config{Cluster: tinyCluster(1, G), Model: tinyModel(L, E, 1), Initial: cur, Window: 4})
		require.NoError(t, err)
		for range 1 + rng.IntN(6) {
			require.NoError(t, r.Observe(Step{Load: skewedLoad(rng, L, E)}))
		}
		for k := 1; k <= 12; k++ {
			prop, err := r.Propose(context.Background(), Budget{MaxMoves: k})
			require.NoError(t, err, "instance %d budget %d", inst, k)
			require.NoError(t, prop.Plan.Validate(placement.ValidateOptions{Experts: E, Layers: L}))
			for l := range L {
				n := positionsChanged(cur.Layers[l], prop.Plan.Layers[l])
				assert.LessOrEqual(t, n, k, "instance %d budget %d layer %d", inst, k, l)
				assert.Equal(t, n, prop.Moved[l], "instance %d layer %d: Moved", inst, l)
				assert.Equal(t, cur.SlotsPerGPU(l), prop.Plan.SlotsPerGPU(l))
				moved += n
			}
			assert.LessOrEqual(t, prop.StepSec, prop.CurrentStepSec*(1+1e-12), "instance %d budget %d: a proposal never makes the modeled step slower", inst, k)
		}
	}
	assert.Positive(t, moved, "the instances must exercise moves")
}

// TestProposeDecodeActivatedExperts: every GPU gets 6 tokens per step, so
// a token balancer sees nothing to do; but GPU 1's tokens activate three
// experts and GPU 0's one, and in decode weight reads dominate: the
// rebalancer moves a cold expert to GPU 1 when the steps are decode steps,
// and leaves the plan alone when the phase is unknown (prefill reads every
// held expert anyway). Catches a rebalancer that balances tokens only.
func TestProposeDecodeActivatedExperts(t *testing.T) {
	cur := planOf(2, 6, [][][]int{{{0, 1, 2}, {3, 4, 5}}})
	load := [][]float64{{6, 0, 0, 2, 2, 2}}
	for _, c := range []struct {
		phase Phase
		moves bool
	}{{PhaseDecode, true}, {PhaseAny, false}} {
		t.Run(c.phase.String(), func(t *testing.T) {
			r, err := New(Config{Cluster: tinyCluster(1, 2), Model: tinyModel(1, 6, 1), Initial: cur})
			require.NoError(t, err)
			for range 4 {
				require.NoError(t, r.Observe(Step{Load: load, Phase: c.phase}))
			}
			prop, err := r.Propose(context.Background(), Budget{MaxMoves: 2, Phase: c.phase})
			require.NoError(t, err)
			// Before: GPU 1 runs 6 tokens and 3 experts, 36 µs.
			assert.InDelta(t, 36e-6, prop.CurrentStepSec, 1e-12)
			if !c.moves {
				assert.Zero(t, prop.MovedSlots)
				return
			}
			assert.Equal(t, 2, prop.MovedSlots)
			assert.Less(t, prop.StepSec, 30e-6)
			act := costmodel.ActivatedExperts(prop.Plan.Layers[0], 2, load[0])
			assert.Equal(t, []float64{2, 2}, act)
		})
	}
}

// deepSeekShaped is a DeepSeek-V3-sized instance (58 layers × 256
// experts, 32 GPUs, 32 redundant slots) with a running EPLB-like plan from
// one load and a window of shifted loads.
func deepSeekShaped(t *testing.T) (*Rebalancer, Budget) {
	t.Helper()
	rng := rand.New(rand.NewPCG(5, 8))
	m, err := costmodel.ModelPreset("deepseek-v3")
	require.NoError(t, err)
	c, err := costmodel.ClusterPreset("h100x8")
	require.NoError(t, err)
	c = c.WithNodes(4)
	r, err := New(Config{Cluster: c, Model: m, RedundantSlots: 32, Window: 8})
	require.NoError(t, err)
	for range 8 {
		require.NoError(t, r.Observe(Step{Load: skewedLoad(rng, 58, 256)}))
	}
	return r, Budget{MaxMoves: 16}
}

// TestProposeDeterministic: the same inputs give the same plan bytes, run
// twice and with GOMAXPROCS 1 and 2, for incremental and fresh proposals.
// Catches map-order or parallel scheduling leaking into the plan, and a
// fresh search that stops on the clock instead of on its own.
func TestProposeDeterministic(t *testing.T) {
	if testing.Short() {
		t.Skip("DeepSeek-sized solves")
	}
	encode := func(procs int, fresh bool) []byte {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		r, b := deepSeekShaped(t)
		b.Fresh = fresh
		prop, err := r.Propose(context.Background(), b)
		require.NoError(t, err)
		require.False(t, prop.TimedOut)
		require.Positive(t, prop.MovedSlots)
		var buf bytes.Buffer
		require.NoError(t, placement.Write(&buf, prop.Plan, placement.FormatJSON))
		return buf.Bytes()
	}
	for _, fresh := range []bool{false, true} {
		first := encode(2, fresh)
		assert.Equal(t, first, encode(2, fresh), "fresh %v", fresh)
		assert.Equal(t, first, encode(1, fresh), "fresh %v", fresh)
	}
}

func TestNewErrors(t *testing.T) {
	c, m := tinyCluster(1, 2), tinyModel(1, 4, 1)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no model", Config{Cluster: c}, "Config.Model has 0 layers"},
		{"bad decay", Config{Cluster: c, Model: m, Decay: 1.5}, "Config.Decay 1.5"},
		{"never forgets", Config{Cluster: c, Model: m, Window: -1}, "never forget"},
		{"uneven slots", Config{Cluster: c, Model: m, RedundantSlots: 1}, "do not divide over 2 GPUs"},
		{"initial on other GPUs", Config{Cluster: c, Model: m, Initial: planOf(4, 4, [][][]int{{{0}, {1}, {2}, {3}}})}, "Config.Initial is for 4 GPUs"},
		{"initial misses an expert", Config{Cluster: c, Model: m, Initial: planOf(2, 4, [][][]int{{{0, 1}, {2, 2}}})}, "Config.Initial"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestObserveAndProposeErrors(t *testing.T) {
	r, err := New(Config{Cluster: tinyCluster(1, 2), Model: tinyModel(1, 4, 1)})
	require.NoError(t, err)
	_, err = r.Propose(context.Background(), Budget{})
	assert.ErrorContains(t, err, "no load steps observed yet")
	assert.ErrorContains(t, r.Observe(Step{Load: [][]float64{{1, 2, 3}}}), "step 0: load[0] has 3 experts, the model 4")
	assert.ErrorContains(t, r.Observe(Step{Load: [][]float64{{1, 2, 3, -1}}}), "load[0][3] = -1")
	assert.ErrorContains(t, r.Observe(Step{Load: [][]float64{{1, 2, 3, 4}}, Phase: 7}), "unknown phase 7")
	require.NoError(t, r.Observe(Step{Load: [][]float64{{1, 2, 3, 4}}, Phase: PhasePrefill}))
	_, err = r.Propose(context.Background(), Budget{Phase: PhaseDecode})
	assert.ErrorContains(t, err, "no decode steps observed yet")
	_, err = r.Propose(context.Background(), Budget{MaxMoves: -1})
	assert.ErrorContains(t, err, "none may be negative")
	assert.ErrorContains(t, r.Install(planOf(2, 4, [][][]int{{{0, 1, 2}, {3}}})), "holds [3 1] slots per GPU, the current plan [2 2]")
	assert.NoError(t, r.Install(planOf(2, 4, [][][]int{{{3, 1}, {2, 0}}})))
	assert.Equal(t, []routing.Expert{3, 1, 2, 0}, r.Current().Layers[0].SlotExpert)
}

// TestConcurrentObserve: steps arrive while proposals are solved and
// plans installed (run with -race).
func TestConcurrentObserve(t *testing.T) {
	r, err := New(Config{Cluster: tinyCluster(1, 4), Model: tinyModel(2, 8, 2), Window: 5})
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 1))
	require.NoError(t, r.Observe(Step{Load: skewedLoad(rng, 2, 8)}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(2, 2))
		for range 200 {
			if err := r.Observe(Step{Load: skewedLoad(rng, 2, 8)}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 20 {
		prop, err := r.Propose(context.Background(), Budget{MaxMoves: 2})
		require.NoError(t, err)
		require.NoError(t, r.Install(prop.Plan))
	}
	<-done
}

// dealtWindowSec is the mean over steps of plan's compute tails as
// costmodel.StepTails prices them under d, added over layers: the
// window's modeled step time, recomputed outside the Rebalancer.
func dealtWindowSec(t *testing.T, plan *placement.Plan, steps [][][]float64, c costmodel.Cluster, m costmodel.Model, d placement.Dispatch) float64 {
	t.Helper()
	sum := 0.0
	for _, st := range steps {
		tails, err := costmodel.StepTails(plan, st, m.TopK, c, m, costmodel.Options{Dispatch: d})
		require.NoError(t, err)
		for _, x := range tails {
			sum += x
		}
	}
	return sum / float64(len(steps))
}

// TestProposeKeepsByDealtTail: the even split and SGLang's deal disagree
// on whether a change helps, and the Rebalancer decides by the dispatch
// configured. 4 GPUs on one node with two slots each; expert 0 takes 400
// tokens a step (100 from each rank: count-only loads) and has copies on
// GPUs 0 and 1, whose ranks keep their tokens while ranks 2 and 3 are
// dealt one to each: 200 on each copy either way. The solve adds a third
// copy; the even split gives each copy 133⅓ and calls that a gain, but the
// deal sends rank 3's 100 to one of the three copies, which still
// computes 200, so under DispatchSGLangStatic the layer is put back. It
// fails when windowCost prices steps with StepCompute's even split.
func TestProposeKeepsByDealtTail(t *testing.T) {
	c, m := tinyCluster(1, 4), tinyModel(1, 6, 1)
	cur := planOf(4, 6, [][][]int{{{0, 1}, {0, 2}, {3, 5}, {4, 5}}})
	steps := [][][]float64{{{400, 1, 1, 10, 10, 10}}}
	props := map[placement.Dispatch]*Proposal{}
	for _, d := range []placement.Dispatch{placement.DispatchEven, placement.DispatchSGLangStatic} {
		r, err := New(Config{Cluster: c, Model: m, Initial: cur, Dispatch: d})
		require.NoError(t, err)
		for _, st := range steps {
			require.NoError(t, r.Observe(Step{Load: st}))
		}
		prop, err := r.Propose(context.Background(), Budget{})
		require.NoError(t, err)
		props[d] = prop
	}
	even, dealt := props[placement.DispatchEven], props[placement.DispatchSGLangStatic]
	// Under even dispatch the solve's plan is the proposal, a third copy
	// of expert 0.
	require.Equal(t, 0, even.Kept)
	require.Positive(t, even.MovedSlots)
	counts := copyCountsOf(even.Plan.Layers[0], 6)
	require.Equal(t, 3, counts[0], "the solve gives expert 0 a third copy")
	require.Less(t, dealtWindowSec(t, even.Plan, steps, c, m, placement.DispatchEven), dealtWindowSec(t, cur, steps, c, m, placement.DispatchEven), "the even split calls it a gain")
	require.GreaterOrEqual(t, dealtWindowSec(t, even.Plan, steps, c, m, placement.DispatchSGLangStatic), dealtWindowSec(t, cur, steps, c, m, placement.DispatchSGLangStatic), "the deal does not")
	assert.InDelta(t, (400.0/3+10+20)*1e-6, even.StepSec, 1e-12)

	assert.Equal(t, 1, dealt.Kept, "put back by the dealt tail")
	assert.Zero(t, dealt.MovedSlots)
	assert.Equal(t, cur.Layers, dealt.Plan.Layers)
	assert.InDelta(t, (200+1+20)*1e-6, dealt.CurrentStepSec, 1e-12, "the current plan as dealt")
	assert.Equal(t, dealt.CurrentStepSec, dealt.StepSec)
	assert.Zero(t, dealt.GainSec)
}

// copyCountsOf is the number of copies of each of E experts in lp.
func copyCountsOf(lp placement.LayerPlan, E int) []int {
	n := make([]int, E)
	for _, e := range lp.SlotExpert {
		n[e]++
	}
	return n
}

// TestProposeDealtScoresTheResult: under SGLang's tables, where putting a
// layer back changes the deal of the layers after it, a proposal's step
// times are those of the plans it reports, dealt as a whole (recomputed
// here with costmodel.StepTails), and the proposal is never slower than
// the current plan, on random multi-layer instances.
func TestProposeDealtScoresTheResult(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 2))
	for _, d := range []placement.Dispatch{placement.DispatchSGLangStatic, placement.DispatchSGLangStaticNarrow} {
		for trial := range 12 {
			L, E, G, per := 2+rng.IntN(3), 6+rng.IntN(6), 4, 3
			nodes := 1 + rng.IntN(2)
			c, m := tinyCluster(nodes, G/nodes), tinyModel(L, E, 2)
			cur := randomPlan(rng, L, E, G, per)
			r, err := New(Config{Cluster: c, Model: m, Initial: cur, Dispatch: d})
			require.NoError(t, err)
			var steps [][][]float64
			for range 3 {
				st := skewedLoad(rng, L, E)
				steps = append(steps, st)
				require.NoError(t, r.Observe(Step{Load: st}))
			}
			prop, err := r.Propose(context.Background(), Budget{MaxMoves: 2 * rng.IntN(3)})
			require.NoError(t, err)
			name := fmt.Sprintf("%v trial %d", d, trial)
			assert.InDelta(t, dealtWindowSec(t, cur, steps, c, m, d), prop.CurrentStepSec, 1e-12, name)
			assert.InDelta(t, dealtWindowSec(t, prop.Plan, steps, c, m, d), prop.StepSec, 1e-12, name)
			assert.LessOrEqual(t, prop.StepSec, prop.CurrentStepSec, name)
			if prop.MovedSlots > 0 {
				assert.Less(t, prop.StepSec, prop.CurrentStepSec*(1-1e-12), name)
			}
		}
	}
}
