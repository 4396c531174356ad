package baseline

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// TestAddCopiesHand: 4 experts on 2 GPUs (contiguous: 0,1 | 2,3) with 2
// redundant slots. Expert 0 carries 100 tokens, the others 10: the first
// copy goes to expert 0 on GPU 1 (the only GPU without it), which leaves
// expert 0 at 50 a copy, still the hottest; but both GPUs now hold it, and
// the one free slot left is on GPU 0, which holds expert 1, so it goes to
// expert 2 (10 a copy like 1 and 3; ties: lower id among those that fit).
func TestAddCopiesHand(t *testing.T) {
	plan, err := Contiguous(1, 4, 2)
	require.NoError(t, err)
	stats := &routing.Stats{Layers: 1, Experts: 4, Load: [][]float64{{100, 10, 10, 10}}}
	got, err := AddCopies(plan, stats, []int{3, 3}, AddCopiesOptions{})
	require.NoError(t, err)
	require.NoError(t, got.Validate(placement.ValidateOptions{Experts: 4, Layers: 1}))
	assert.Equal(t, ex(0, 1, 2, 0, 2, 3), got.Layers[0].SlotExpert)
	assert.Equal(t, gp(0, 0, 0, 1, 1, 1), got.Layers[0].SlotGPU)
	assert.Equal(t, [][]placement.GPU{{0, 1}, {0}, {0, 1}, {1}}, got.ExpertGPUs(0))
	// The input plan is not changed.
	assert.Len(t, plan.Layers[0].SlotExpert, 4)
}

// TestAddCopiesLeastLoaded: the copy lands on the least loaded GPU that
// lacks the expert, speed taken into account.
func TestAddCopiesLeastLoaded(t *testing.T) {
	// Experts 0..3 on GPUs 0..3 (round-robin), expert 0 the hottest.
	plan, err := RoundRobin(1, 4, 4)
	require.NoError(t, err)
	stats := &routing.Stats{Layers: 1, Experts: 4, Load: [][]float64{{40, 30, 5, 20}}}
	got, err := AddCopies(plan, stats, []int{2, 1, 2, 2}, AddCopiesOptions{})
	require.NoError(t, err)
	// Copy 1: expert 0 (40) to GPU 2 (load 5). Copy 2: expert 1 (30) to
	// the least loaded of GPUs 0 (20), 2 (25), 3 (20) with a free slot and
	// without it: GPU 0 (ties: lower index). Copy 3: expert 0 or 1 at 20
	// or 15 a copy, or 3 at 20: expert 0 (20, lower id than 3) has copies
	// on 0 and 2, so it goes to GPU 3.
	assert.Equal(t, [][]placement.GPU{{0, 2, 3}, {0, 1}, {2}, {3}}, got.ExpertGPUs(0))

	// Loads 40, 30, 25, 20 with free slots on GPUs 2 and 3: expert 0's
	// copy goes to GPU 3 (20 < 25), expert 1's to GPU 2; with GPU 2 twice
	// as fast (25/2 < 20) the other way round.
	stats.Load[0] = []float64{40, 30, 25, 20}
	got, err = AddCopies(plan, stats, []int{1, 1, 2, 2}, AddCopiesOptions{})
	require.NoError(t, err)
	assert.Equal(t, [][]placement.GPU{{0, 3}, {1, 2}, {2}, {3}}, got.ExpertGPUs(0))
	got, err = AddCopies(plan, stats, []int{1, 1, 2, 2}, AddCopiesOptions{Speed: []float64{1, 1, 2, 1}})
	require.NoError(t, err)
	assert.Equal(t, [][]placement.GPU{{0, 2}, {1, 3}, {2}, {3}}, got.ExpertGPUs(0))
}

// TestAddCopiesRandom: on random plans and loads every GPU ends with its
// slot count, the old copies stay, no GPU holds an expert twice, and the
// result is deterministic.
func TestAddCopiesRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 200 {
		G := 1 + rng.IntN(8)
		per := 1 + rng.IntN(4)
		E := G*per - rng.IntN(min(G, G*per)) // E ≤ G·per, at least G·per−G+1
		L := 1 + rng.IntN(3)
		stats := &routing.Stats{Layers: L, Experts: E, Load: make([][]float64, L)}
		for l := range L {
			stats.Load[l] = make([]float64, E)
			for e := range E {
				stats.Load[l][e] = float64(rng.IntN(100))
			}
		}
		plan, err := RoundRobin(L, E, G)
		require.NoError(t, err)
		slots := slices.Repeat([]int{per}, G)
		got, err := AddCopies(plan, stats, slots, AddCopiesOptions{})
		require.NoError(t, err, "G=%d per=%d E=%d", G, per, E)
		require.NoError(t, got.Validate(placement.ValidateOptions{Experts: E, Layers: L}))
		again, err := AddCopies(plan, stats, slots, AddCopiesOptions{})
		require.NoError(t, err)
		assert.True(t, got.Equal(again))
		for l := range L {
			assert.Equal(t, slots, got.SlotsPerGPU(l))
			before, after := plan.ExpertGPUs(l), got.ExpertGPUs(l)
			for e := range E {
				for _, g := range before[e] {
					assert.Contains(t, after[e], g, "layer %d expert %d lost its copy on GPU %d", l, e, g)
				}
			}
		}
	}
}

// TestAddCopiesRefuses: a GPU already over its slot count, or free slots
// only on GPUs that hold every expert, are errors, not a wrong plan.
func TestAddCopiesRefuses(t *testing.T) {
	plan, err := RoundRobin(1, 5, 2) // GPU 0 holds 3
	require.NoError(t, err)
	stats := &routing.Stats{Layers: 1, Experts: 5, Load: [][]float64{{1, 1, 1, 1, 1}}}
	_, err = AddCopies(plan, stats, []int{2, 4}, AddCopiesOptions{})
	assert.EqualError(t, err, "baseline: add copies: layer 0: GPU 0 holds 3 slots, more than the 2 it is given")

	plan, err = RoundRobin(1, 2, 2)
	require.NoError(t, err)
	stats = &routing.Stats{Layers: 1, Experts: 2, Load: [][]float64{{1, 1}}}
	_, err = AddCopies(plan, stats, []int{3, 1}, AddCopiesOptions{})
	assert.EqualError(t, err, "baseline: add copies: layer 0: 1 free slots left, but every GPU with a free slot already holds each expert")

	_, err = AddCopies(plan, stats, []int{1}, AddCopiesOptions{})
	assert.EqualError(t, err, "baseline: add copies: 1 slot counts for 2 GPUs")
}
