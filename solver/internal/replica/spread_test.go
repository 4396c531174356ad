package replica

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

// The traffic bound holds for every plan at most as unbalanced, and the
// local loads and traffic agree with their definitions: brute force over
// all plans of 5 experts on 2 nodes × 2 GPUs with 2 slots each.
func TestTrafficBoundBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const E, G, P, N, S = 5, 4, 2, 2, 2
	var pairs [][2]int
	for a := 0; a < E; a++ {
		for b := a + 1; b < E; b++ {
			pairs = append(pairs, [2]int{a, b})
		}
	}
	speed := []float64{1, 1, 1, 1}
	for it := 0; it < 20; it++ {
		load := make([]float64, E)
		for e := range load {
			load[e] = 1 + math.Floor(100*rng.Float64()*rng.Float64())
		}
		checked, tight := 0, 0
		var rec func(g int, choice []int)
		rec = func(g int, choice []int) {
			if g == G {
				copies := make([][]placement.GPU, E)
				for h, c := range choice {
					for _, e := range pairs[c] {
						copies[e] = append(copies[e], placement.GPU(h))
					}
				}
				cnt := make([]int, E)
				for e := range copies {
					if len(copies[e]) == 0 {
						return
					}
					cnt[e] = len(copies[e])
				}
				gl := gpuLoads(load, copies, speed, P)
				busiest, total := 0.0, 0.0
				for _, v := range gl {
					busiest = math.Max(busiest, v)
					total += v
				}
				require.InDelta(t, sum(load), total, 1e-9)
				tr := nodeTraffic(load, copies, P, N)
				// Traffic by definition: sources on nodes without a copy.
				want := 0.0
				for e, gs := range copies {
					has := map[int]bool{}
					for _, g := range gs {
						has[int(g)/P] = true
					}
					want += load[e] * float64(N-len(has)) / N
				}
				require.InDelta(t, want, tr, 1e-9)
				tc := trafficCounts(load, G*S, N, busiest)
				require.NotNil(t, tc)
				bound := countsTraffic(load, tc, N)
				require.LessOrEqual(t, bound, tr+1e-9, "load %v plan %v: bound above a plan with busiest %v", load, copies, busiest)
				if bound > 0 && math.Abs(bound-tr) < 1e-9 {
					tight++
				}
				checked++
				return
			}
			for c := range pairs {
				rec(g+1, append(choice, c))
			}
		}
		rec(0, nil)
		require.Positive(t, checked)
		require.Positive(t, tight, "the bound is attained by some plan")
	}
}

func sum(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += v
	}
	return s
}
