package replica

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

// bruteGrouped is the smallest busiest load per unit of speed over every
// plan of one layer that keeps each group of consecutive experts, and its
// copies, on one node: every assignment of groups to nodes, then every
// way of filling each GPU with slots[g] distinct experts of its node's
// groups (each expert at least once), tokens split evenly over copies.
// +Inf when no plan exists.
func bruteGrouped(load, speed []float64, slots []int, groups, perNode int) float64 {
	E, G := len(load), len(slots)
	N, size := G/perNode, E/groups
	best := math.Inf(1)
	nodeOf := make([]int, groups)
	choice := make([]int, G)
	var fill func(g int)
	fill = func(g int) {
		if g == G {
			cnt := make([]int, E)
			for _, m := range choice {
				for e := range E {
					cnt[e] += m >> e & 1
				}
			}
			for _, c := range cnt {
				if c == 0 {
					return
				}
			}
			busiest := 0.0
			for h, m := range choice {
				t := 0.0
				for e := range E {
					if m>>e&1 == 1 {
						t += load[e] / float64(cnt[e])
					}
				}
				busiest = math.Max(busiest, t/speed[h])
			}
			best = math.Min(best, busiest)
			return
		}
		allowed := 0
		for e := range E {
			if nodeOf[e/size] == g/perNode {
				allowed |= 1 << e
			}
		}
		for m := allowed; m > 0; m = (m - 1) & allowed {
			if bits.OnesCount(uint(m)) == slots[g] {
				choice[g] = m
				fill(g + 1)
			}
		}
		if slots[g] == 0 {
			choice[g] = 0
			fill(g + 1)
		}
	}
	var assign func(k int)
	assign = func(k int) {
		if k == groups {
			fill(0)
			return
		}
		for nd := range N {
			nodeOf[k] = nd
			assign(k + 1)
		}
	}
	assign(0)
	return best
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
		N := 2 + rng.IntN(2)
		perNode := 1 + rng.IntN(2)
		groups := N * (1 + rng.IntN(2))
		size := 1 + rng.IntN(2)
		E := groups * size
		if E > 8 {
			continue
		}
		G := N * perNode
		load := make([]float64, E)
		for e := range load {
			load[e] = math.Round(10 + 990*math.Pow(rng.Float64(), 3))
		}
		speed := make([]float64, G)
		for g := range speed {
			speed[g] = []float64{1, 1.5}[rng.IntN(2)]
		}
		slots := make([]int, G)
		total := 0
		for g := range slots {
			slots[g] = 1 + rng.IntN(3)
			total += slots[g]
		}
		if total < E {
			continue
		}
		name := fmt.Sprintf("%d: load %v speed %v slots %v groups %d perNode %d", it, load, speed, slots, groups, perNode)
		opt := bruteGrouped(load, speed, slots, groups, perNode)
		got := groupBound(load, speed, slots, groups, perNode)
		if math.IsInf(opt, 1) {
			continue // no grouped plan fills these slots: any bound holds
		}
		checked++
		assert.LessOrEqual(t, got, opt*(1+1e-9), name)
		basic := layerBalance(load, nil, speed, replicaLayout{slots: slots, total: total}, G, 0).Bound
		assert.Positive(t, got, name)
		if got > basic*(1+1e-9) {
			raised++
		}
	}
	t.Logf("%d layers checked, the bound above the basic one on %d", checked, raised)
	assert.Greater(t, checked, 150)
	assert.Greater(t, raised, checked/4)
}
