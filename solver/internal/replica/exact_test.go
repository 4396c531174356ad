package replica

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// busiestOf recounts a layer's busiest load per unit of speed from its
// copies, checking that they are a plan with the given slots: every
// expert at least one copy, no GPU two copies of one expert, every GPU
// its slot count.
func busiestOf(t *testing.T, load, speed []float64, slots []int, copies [][]placement.GPU) float64 {
	t.Helper()
	tok := make([]float64, len(slots))
	n := make([]int, len(slots))
	for e, gs := range copies {
		require.NotEmpty(t, gs, "expert %d has no copy", e)
		seen := map[placement.GPU]bool{}
		for _, g := range gs {
			require.False(t, seen[g], "expert %d twice on GPU %d", e, g)
			seen[g] = true
			tok[g] += load[e] / float64(len(gs))
			n[g]++
		}
	}
	require.Equal(t, slots, n, "slots per GPU")
	b := 0.0
	for g, v := range tok {
		b = math.Max(b, v/speed[g])
	}
	return b
}

// TestExactPackBruteForce: on random layers of 2–4 GPUs with 1–4 slots
// each (equal speeds), the exhaustive search from no incumbent finds the
// brute-force optimum and says it is complete; from the optimum itself
// it finds nothing below it and is still complete, which makes the
// optimum a bound. A search that stops at its first packing, or that
// skips count vectors, misses the optimum on some of them.
func TestExactPackBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 5))
	for it := range 40 {
		G := 2 + rng.IntN(3)
		slots := make([]int, G)
		S := 0
		for g := range slots {
			slots[g] = 1 + rng.IntN(4)
			S += slots[g]
		}
		// At most 8 experts keeps the brute force (every GPU every subset)
		// within a second.
		E := min(S, 8, max(2, slices.Max(slots), S/2+rng.IntN(S/2+1)))
		load := make([]float64, E)
		for e := range load {
			load[e] = math.Round(1000 / math.Pow(float64(e+1), 0.3+1.5*rng.Float64()))
		}
		rng.Shuffle(E, func(i, j int) { load[i], load[j] = load[j], load[i] })
		speed := make([]float64, G)
		for g := range speed {
			speed[g] = 1
		}
		name := fmt.Sprintf("%d: load %v slots %v", it, load, slots)
		opt := testkit.BruteBusiestSlots(load, slots)
		cp, b, complete := exactPack(load, speed, slots, math.Inf(1), task.ByWork(context.Background(), 1<<30))
		require.True(t, complete, name)
		require.NotNil(t, cp, name)
		assert.InDelta(t, opt, b, 1e-9*opt, name)
		assert.InDelta(t, b, busiestOf(t, load, speed, slots, cp), 1e-9*b, name)
		cp, b, complete = exactPack(load, speed, slots, opt, task.ByWork(context.Background(), 1<<30))
		assert.True(t, complete, name)
		assert.Nil(t, cp, "%s: nothing is below the optimum", name)
		assert.Equal(t, opt, b, name)
	}
}

// TestExactPackSpeeds: with GPUs of two speeds the search weighs tokens
// by speed; its plan is never worse than the packer's, recounted, and a
// complete search is at most every random plan of the same slots.
func TestExactPackSpeeds(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	for it := range 20 {
		G, per := 3, 3
		slots := []int{per, per, per}
		speed := []float64{1, 1, 0.5}
		E := 5 + rng.IntN(3)
		load := make([]float64, E)
		for e := range load {
			load[e] = 10 + math.Round(990*rng.Float64()*rng.Float64())
		}
		name := fmt.Sprintf("%d: load %v", it, load)
		cp, b, complete := exactPack(load, speed, slots, math.Inf(1), task.ByWork(context.Background(), 1<<30))
		require.True(t, complete, name)
		require.NotNil(t, cp, name)
		assert.InDelta(t, b, busiestOf(t, load, speed, slots, cp), 1e-9*b, name)
		// Random plans: a random copy count vector packed at random.
		for range 200 {
			cnt := make([]int, E)
			for e := range cnt {
				cnt[e] = 1
			}
			for extra := G*per - E; extra > 0; {
				if e := rng.IntN(E); cnt[e] < G {
					cnt[e]++
					extra--
				}
			}
			copies := make([][]placement.GPU, E)
			free := slices3(per, G)
			ok := true
			for e, c := range cnt {
				perm := rng.Perm(G)
				for _, g := range perm {
					if c > 0 && free[g] > 0 {
						copies[e] = append(copies[e], placement.GPU(g))
						free[g]--
						c--
					}
				}
				ok = ok && c == 0
			}
			if !ok {
				continue
			}
			n := 0
			for _, f := range free {
				n += f
			}
			if n != 0 {
				continue
			}
			assert.LessOrEqual(t, b, busiestOf(t, load, speed, slots, copies)*(1+1e-9), name)
		}
	}
}

func slices3(v, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// TestExactPackGivesUp: on a layer of 256 experts the count vectors are
// far too many for a budget of 10⁹ nodes; the search sees it in its first
// check and returns incomplete, having spent one check's nodes.
func TestExactPackGivesUp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	E, G := 256, 32
	load := make([]float64, E)
	for e := range load {
		load[e] = 1 + 1000*rng.Float64()*rng.Float64()
	}
	slots := slices3(9, G)
	speed := make([]float64, G)
	for g := range speed {
		speed[g] = 1
	}
	const budget = 1_000_000_000
	m := task.ByWork(context.Background(), budget)
	_, _, complete := exactPack(load, speed, slots, math.Inf(1), m)
	assert.False(t, complete)
	assert.Equal(t, int64(budget-1024), m.Left(), "it must give up at its first check, not spend the budget")
}

// TestExactPackGivesUpOnAHardFirstVector: 18 experts on 6 GPUs with 4
// slots each. The count vectors are few enough to try (about 10⁵) but
// the first one's packing does not end; the search must see that before
// any vector is done and give up, spending a sliver of a budget of 10⁹
// nodes. Projecting one node per slot for that vector spends it all.
func TestExactPackGivesUpOnAHardFirstVector(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	load := make([]float64, 18)
	for e := range load {
		load[e] = math.Round(100 + 1900*math.Pow(rng.Float64(), 2))
	}
	speed := []float64{1, 1, 1, 1, 1, 1}
	const budget = 1_000_000_000
	m := task.ByWork(context.Background(), budget)
	_, _, complete := exactPack(load, speed, slices3(4, 6), math.Inf(1), m)
	assert.False(t, complete)
	assert.Greater(t, m.Left(), int64(budget-10_000_000), "it must give up early, not spend the budget")
}
