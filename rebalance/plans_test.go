package rebalance

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

func TestDefaultPlan(t *testing.T) {
	p, err := DefaultPlan(2, 4, 2, 3)
	require.NoError(t, err)
	require.NoError(t, p.Validate(placement.ValidateOptions{Experts: 4, Layers: 2}))
	assert.Equal(t, []routing.Expert{0, 1, 2, 3, 0, 1}, p.Layers[1].SlotExpert)
	assert.Equal(t, []placement.GPU{0, 0, 1, 1, 2, 2}, p.Layers[1].SlotGPU)
	_, err = DefaultPlan(1, 4, 1, 2)
	assert.ErrorContains(t, err, "do not divide over 2 GPUs")
	_, err = DefaultPlan(1, 2, 4, 2)
	assert.ErrorContains(t, err, "two copies of an expert on one GPU")
}

// TestChangedSlotsAndAlign: a copy that stays on its GPU is not a change
// wherever its slot is; Align puts it back in its old slot, so the files
// differ in exactly the changed slots. Catches position-by-position
// counting (which would report 4 here) and an Align that reshuffles.
func TestChangedSlotsAndAlign(t *testing.T) {
	prev := planOf(2, 4, [][][]int{{{0, 1}, {2, 3}}})
	// Expert 1 and 2 trade GPUs; 0 and 3 stay, listed in other slots.
	next := planOf(2, 4, [][][]int{{{2, 0}, {3, 1}}})
	got, err := ChangedSlots(prev, next)
	require.NoError(t, err)
	assert.Equal(t, []int{2}, got)
	al, err := Align(prev, next)
	require.NoError(t, err)
	assert.Equal(t, []routing.Expert{0, 2, 1, 3}, al.Layers[0].SlotExpert)
	assert.Equal(t, []placement.GPU{0, 0, 1, 1}, al.Layers[0].SlotGPU)
	assert.Equal(t, 2, positionsChanged(prev.Layers[0], al.Layers[0]))

	_, err = ChangedSlots(prev, planOf(4, 4, [][][]int{{{0}, {1}, {2}, {3}}}))
	assert.ErrorContains(t, err, "plans on 2 and 4 GPUs")
}

// TestAlignRandom: on random replicated plans, the aligned plan is the
// same placement (the same copies per GPU) and differs from prev in
// exactly ChangedSlots slots per layer; next's log2phy (StackEPLB, in a
// random replica order) comes out naming slots that hold its expert, on
// the GPUs next's rows name, in the same order, so that the stack deals
// the aligned plan as next. Catches an Align that drops the log2phy or
// leaves it naming next's slot numbers.
func TestAlignRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		G := 2 + rng.IntN(4)
		E := G * (1 + rng.IntN(3))
		per := min(E, E/G+rng.IntN(3))
		L := 1 + rng.IntN(3)
		prev, next := randomPlan(rng, L, E, G, per), randomPlan(rng, L, E, G, per)
		next.StackEPLB = randomLog2Phy(rng, next)
		al, err := Align(prev, next)
		require.NoError(t, err)
		ch, err := ChangedSlots(prev, next)
		require.NoError(t, err)
		require.NotNil(t, al.StackEPLB, "instance %d", i)
		for l := range L {
			assert.Equal(t, next.ExpertGPUs(l), al.ExpertGPUs(l), "instance %d layer %d: same copies", i, l)
			assert.Equal(t, ch[l], positionsChanged(prev.Layers[l], al.Layers[l]), "instance %d layer %d", i, l)
			seen := map[int32]bool{}
			for e, row := range al.StackEPLB.Log2Phy[l] {
				require.Len(t, row, len(next.StackEPLB.Log2Phy[l][e]))
				for j, s := range row {
					assert.False(t, seen[s], "instance %d layer %d: slot %d named twice", i, l, s)
					seen[s] = true
					assert.Equal(t, routing.Expert(e), al.Layers[l].SlotExpert[s], "instance %d layer %d expert %d", i, l, e)
					assert.Equal(t, next.Layers[l].SlotGPU[next.StackEPLB.Log2Phy[l][e][j]], al.Layers[l].SlotGPU[s], "instance %d layer %d expert %d replica %d: same GPU", i, l, e, j)
				}
			}
		}
	}
}

// randomLog2Phy lists every expert's slots of p in a random replica order.
func randomLog2Phy(rng *rand.Rand, p *placement.Plan) *placement.StackEPLB {
	st := &placement.StackEPLB{Log2Phy: make([][][]int32, len(p.Layers))}
	for l, lp := range p.Layers {
		rows := make([][]int32, p.Experts)
		for s, e := range lp.SlotExpert {
			rows[e] = append(rows[e], int32(s))
		}
		for _, r := range rows {
			rng.Shuffle(len(r), func(a, b int) { r[a], r[b] = r[b], r[a] })
		}
		st.Log2Phy[l] = rows
	}
	return st
}

// TestMigrationTime: 2 nodes × 2 GPUs (NVLink 1e9 B/s, NIC 0.5e9 B/s per
// direction), 1000-byte experts. GPU 1 takes expert 0 from GPU 0 (same
// node, 1 µs on NVLink) and GPU 2 takes expert 1 from GPU 0 or 1 across
// nodes (2 µs on the NICs): 2 µs for the layer. Catches serial counting (3
// µs) and a wrong link choice.
func TestMigrationTime(t *testing.T) {
	c, m := tinyCluster(2, 2), tinyModel(1, 4, 1)
	prev := planOf(4, 4, [][][]int{{{0, 1}, {1, 2}, {2, 3}, {3, 0}}})
	next := planOf(4, 4, [][][]int{{{0, 1}, {1, 0}, {2, 1}, {3, 0}}})
	got, err := MigrationTime(prev, next, c, m)
	require.NoError(t, err)
	assert.InDelta(t, 2e-6, got, 1e-15)
	// Five copies move: GPU 0 gets 2 from GPU 1 (NVLink), GPU 1 gets 3
	// from GPU 2 (NIC), GPU 2 gets 0 from GPU 3 (NVLink) and 1 from GPU 0
	// (NIC), GPU 3 gets 2 from GPU 2 (NVLink). No port carries two
	// copies, so the NICs' one copy sets the time: 2 µs.
	next2 := planOf(4, 4, [][][]int{{{0, 2}, {1, 3}, {0, 1}, {3, 2}}})
	ch, err := ChangedSlots(prev, next2)
	require.NoError(t, err)
	require.Equal(t, []int{5}, ch)
	got, err = MigrationTime(prev, next2, c, m)
	require.NoError(t, err)
	assert.InDelta(t, 2e-6, got, 1e-15)
	// Both copies of expert 1 leave node 0 for GPUs 2 and 3, which take
	// them from GPU 0 and GPU 1 (the least busy senders): still 2 µs; from
	// one sender it would be 4.
	next3 := planOf(4, 4, [][][]int{{{0, 2}, {3, 2}, {1, 3}, {1, 0}}})
	got, err = MigrationTime(prev, next3, c, m)
	require.NoError(t, err)
	assert.InDelta(t, 2e-6, got, 1e-15)
	same, err := MigrationTime(prev, prev, c, m)
	require.NoError(t, err)
	assert.Zero(t, same)
}

// TestLayerPAR by hand: expert 0 has two copies splitting 8 tokens.
func TestLayerPAR(t *testing.T) {
	p := planOf(2, 3, [][][]int{{{0, 1}, {0, 2}}})
	// GPU 0: 4 + 2 = 6, GPU 1: 4 + 6 = 10, mean 8.
	assert.InDelta(t, 10.0/8, LayerPAR(p.Layers[0], 2, []float64{8, 2, 6}), 1e-12)
	assert.Equal(t, 1.0, LayerPAR(p.Layers[0], 2, []float64{0, 0, 0}))
	two := planOf(2, 3, [][][]int{{{0, 1}, {0, 2}}, {{0, 1}, {0, 2}}})
	assert.InDelta(t, (10.0/8+1)/2, StepPAR(two, [][]float64{{8, 2, 6}, {2, 1, 1}}), 1e-12)
}

// TestWindowArithmetic: the last W steps, decayed by age, and the
// unlimited decayed sum, against sums written out by hand.
func TestWindowArithmetic(t *testing.T) {
	step := func(v float64) [][]float64 { return [][]float64{{v, 2 * v}} }
	cases := []struct {
		name       string
		size       int
		decay      float64
		wantLoad   float64 // of expert 0
		wantWeight float64
		wantSteps  int
	}{
		// Steps 1..5 seen.
		{"last 3", 3, 1, 3 + 4 + 5, 3, 3},
		{"last 3 decayed", 3, 0.5, 0.25*3 + 0.5*4 + 5, 1.75, 3},
		{"more room than steps", 10, 1, 15, 5, 5},
		{"unlimited decayed", 0, 0.5, 1.0/16 + 2.0/8 + 3.0/4 + 4.0/2 + 5, 1.0/16 + 1.0/8 + 1.0/4 + 1.0/2 + 1, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWindow(1, 2, c.size, c.decay)
			for v := 1; v <= 5; v++ {
				w.add(step(float64(v)))
			}
			load, wt := w.load()
			assert.InDelta(t, c.wantLoad, load[0][0], 1e-12)
			assert.InDelta(t, 2*c.wantLoad, load[0][1], 1e-12)
			assert.InDelta(t, c.wantWeight, wt, 1e-12)
			assert.Equal(t, c.wantSteps, w.covered())
			steps, wts := w.steps()
			if c.size == 0 {
				assert.Nil(t, steps)
				return
			}
			// Oldest first, weights decay^age.
			assert.Equal(t, float64(5-len(steps)+1), steps[0][0][0])
			assert.Equal(t, 1.0, wts[len(wts)-1])
			assert.InDelta(t, math.Pow(c.decay, float64(len(wts)-1)), wts[0], 1e-15)
		})
	}
	// The caller's buffer may be reused after add.
	w := newWindow(1, 2, 2, 1)
	buf := step(1)
	w.add(buf)
	buf[0][0] = 100
	load, _ := w.load()
	assert.Equal(t, 1.0, load[0][0])
}

// TestRebalancerPhaseWindows: prefill and decode steps go to their own
// windows; PhaseAny proposes on both.
func TestRebalancerPhaseWindows(t *testing.T) {
	r, err := New(Config{Cluster: tinyCluster(1, 2), Model: tinyModel(1, 4, 1), Window: 2})
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, r.Observe(Step{Load: [][]float64{{float64(i), 0, 0, 0}}, Phase: PhasePrefill}))
	}
	require.NoError(t, r.Observe(Step{Load: [][]float64{{0, 7, 0, 0}}, Phase: PhaseDecode}))
	for _, c := range []struct {
		phase Phase
		load  []float64
		n     int
	}{
		{PhasePrefill, []float64{1 + 2, 0, 0, 0}, 2},
		{PhaseDecode, []float64{0, 7, 0, 0}, 1},
		{PhaseAny, []float64{3, 7, 0, 0}, 3},
	} {
		s, err := r.snapshot(c.phase)
		require.NoError(t, err)
		assert.Equal(t, c.load, s.load[0], c.phase.String())
		assert.Equal(t, c.n, s.n, c.phase.String())
	}
}

// TestRelabelUndoesPermutation: a plan whose GPUs are permuted layer by
// layer relabels back to a plan that moves nothing. Catches a wrong
// direction of the permutation and a non-optimal assignment.
func TestRelabelUndoesPermutation(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for i := range 100 {
		G := 2 + rng.IntN(7)
		E := G * (1 + rng.IntN(3))
		per := min(E, E/G+rng.IntN(3))
		L := 1 + rng.IntN(3)
		prev := randomPlan(rng, L, E, G, per)
		next := prev.Clone()
		for l := range next.Layers {
			perm := rng.Perm(G)
			for s, g := range next.Layers[l].SlotGPU {
				next.Layers[l].SlotGPU[s] = placement.GPU(perm[g])
			}
		}
		got, err := Relabel(prev, next, tinyCluster(1, G))
		require.NoError(t, err)
		ch, err := ChangedSlots(prev, got)
		require.NoError(t, err)
		for l := range L {
			assert.Zero(t, ch[l], "instance %d layer %d", i, l)
		}
	}
}

// TestHungarianBruteForce: the assignment is optimal on random small
// matrices (every permutation tried).
func TestHungarianBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 3))
	var perms func(n int) [][]int
	perms = func(n int) [][]int {
		if n == 0 {
			return [][]int{{}}
		}
		var out [][]int
		for _, p := range perms(n - 1) {
			for i := 0; i <= len(p); i++ {
				q := append(append(append([]int(nil), p[:i]...), n-1), p[i:]...)
				out = append(out, q)
			}
		}
		return out
	}
	for range 200 {
		n := 1 + rng.IntN(5)
		cost := make([][]float64, n)
		for a := range cost {
			cost[a] = make([]float64, n)
			for b := range cost[a] {
				cost[a][b] = float64(rng.IntN(7) - 3)
			}
		}
		to := hungarian(cost)
		got := 0.0
		for b, a := range to {
			got += cost[a][b]
		}
		best := math.Inf(1)
		for _, p := range perms(n) {
			s := 0.0
			for b, a := range p {
				s += cost[a][b]
			}
			best = math.Min(best, s)
		}
		assert.Equal(t, best, got)
	}
}
