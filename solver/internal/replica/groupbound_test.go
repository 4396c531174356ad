package replica

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/solver/internal/task"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// randomGroupedLayer draws a layer small enough for the brute force: 2–3
// nodes of 1–2 GPUs of two speeds, 1–2 groups a node of 1–2 experts (at
// most 8), 1–3 slots a GPU; ok is false when it draws more than 8
// experts or fewer slots than experts.
func randomGroupedLayer(rng *rand.Rand) (load, speed []float64, slots []int, groups, perNode int, ok bool) {
	N := 2 + rng.IntN(2)
	perNode = 1 + rng.IntN(2)
	groups = N * (1 + rng.IntN(2))
	E := groups * (1 + rng.IntN(2))
	if E > 8 {
		return nil, nil, nil, 0, 0, false
	}
	G := N * perNode
	load = make([]float64, E)
	for e := range load {
		load[e] = math.Round(10 + 990*math.Pow(rng.Float64(), 3))
	}
	speed = make([]float64, G)
	for g := range speed {
		speed[g] = []float64{1, 1.5}[rng.IntN(2)]
	}
	slots = make([]int, G)
	total := 0
	for g := range slots {
		slots[g] = 1 + rng.IntN(3)
		total += slots[g]
	}
	return load, speed, slots, groups, perNode, total >= E
}

// TestGroupBoundBruteForce: on random grouped layers (1–3 groups a node,
// one or two GPUs a node of two speeds, spare slots) groupBound is never
// above the brute-force optimum, never below the basic bound it adds to
// (mean and largest replica), and above it on many layers: a bound of 0,
// or one read off a single assignment of groups, fails.
func TestGroupBoundBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 3))
	raised, checked := 0, 0
	for it := range 1000 {
		load, speed, slots, groups, perNode, ok := randomGroupedLayer(rng)
		if !ok {
			continue
		}
		G, total := len(slots), 0
		for _, n := range slots {
			total += n
		}
		name := fmt.Sprintf("%d: load %v speed %v slots %v groups %d perNode %d", it, load, speed, slots, groups, perNode)
		opt := testkit.BruteBusiestGrouped(load, speed, slots, groups, perNode)
		got := groupBound(load, speed, slots, groups, perNode)
		if math.IsInf(opt, 1) {
			continue // no grouped plan fills these slots: any bound holds
		}
		checked++
		assert.LessOrEqual(t, got, opt*(1+1e-9), name)
		basic := layerBalance(load, nil, speed, replicaLayout{slots: slots, total: total}, G, 0, nil).Bound
		assert.Positive(t, got, name)
		if got > basic*(1+1e-9) {
			raised++
		}
	}
	t.Logf("%d layers checked, the bound above the basic one on %d", checked, raised)
	assert.Greater(t, checked, 150)
	assert.Greater(t, raised, checked/4)
}

// TestExactGroupsBruteForce: on random grouped layers the node-by-node
// search finds the brute-force optimum, in a plan that keeps every group
// and its copies on one node with the given slots, and proves it (its
// bound reaches it); with the optimum as the incumbent it finds nothing
// below it and still proves it. A search that takes the first
// assignment of groups, or skips the nodes' searches, fails.
func TestExactGroupsBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 4))
	checked := 0
	for it := range 1000 {
		load, speed, slots, groups, perNode, ok := randomGroupedLayer(rng)
		if !ok {
			continue
		}
		E := len(load)
		opt := testkit.BruteBusiestGrouped(load, speed, slots, groups, perNode)
		if math.IsInf(opt, 1) {
			continue
		}
		checked++
		name := fmt.Sprintf("%d: load %v speed %v slots %v groups %d perNode %d", it, load, speed, slots, groups, perNode)
		cp, b, bound := exactGroups(load, speed, slots, groups, perNode, math.Inf(1), task.ByWork(context.Background(), 1<<30))
		require.NotNil(t, cp, name)
		assert.InDelta(t, opt, b, 1e-9*opt, name)
		assert.InDelta(t, b, busiestOf(t, load, speed, slots, cp), 1e-9*b, name)
		assert.InDelta(t, opt, bound, 1e-9*opt, "%s: the bound proves it", name)
		size := E / groups
		for k := range groups {
			node := -1
			for e := k * size; e < (k+1)*size; e++ {
				for _, g := range cp[e] {
					if node < 0 {
						node = int(g) / perNode
					}
					assert.Equal(t, node, int(g)/perNode, "%s: group %d on two nodes", name, k)
				}
			}
		}
		cp, b, bound = exactGroups(load, speed, slots, groups, perNode, opt, task.ByWork(context.Background(), 1<<30))
		assert.Nil(t, cp, "%s: nothing is below the optimum", name)
		assert.Equal(t, opt, b, name)
		assert.InDelta(t, opt, bound, 1e-9*opt, name)
	}
	assert.Greater(t, checked, 100)
}
