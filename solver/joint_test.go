package solver_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/mip/highs"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
)

// randomTrace makes a trace with skewed experts and sticky transitions.
func randomTrace(rng *rand.Rand, tokens, layers, experts, k int) *routing.Trace {
	t := &routing.Trace{Tokens: tokens, Layers: layers, TopK: k, Experts: experts, IDs: make([]int16, tokens*layers*k)}
	w := make([]float64, experts)
	for e := range w {
		w[e] = math.Pow(rng.Float64(), 2) + 0.05
	}
	for tok := range tokens {
		prev := -1
		for l := range layers {
			used := map[int]bool{}
			for j := range k {
				var e int
				if j == 0 && prev >= 0 && rng.Float64() < 0.5 {
					e = (prev*3 + l) % experts
				} else {
					e = pick(rng, w)
				}
				for used[e] {
					e = (e + 1) % experts
				}
				used[e] = true
				t.IDs[(tok*layers+l)*k+j] = int16(e)
				if j == 0 {
					prev = e
				}
			}
		}
	}
	return t
}

func pick(rng *rand.Rand, w []float64) int {
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	r := rng.Float64() * sum
	for i, v := range w {
		if r < v {
			return i
		}
		r -= v
	}
	return len(w) - 1
}

// assignments enumerates every assignment of E experts to G GPUs with E/G
// each.
func assignments(E, G int) [][]int {
	var out [][]int
	cur := make([]int, E)
	cnt := make([]int, G)
	var rec func(e int)
	rec = func(e int) {
		if e == E {
			out = append(out, append([]int(nil), cur...))
			return
		}
		for g := range G {
			if cnt[g] < E/G {
				cnt[g]++
				cur[e] = g
				rec(e + 1)
				cnt[g]--
			}
		}
	}
	rec(0)
	return out
}

func smallCluster(nodes, perNode int) costmodel.Cluster {
	c, err := costmodel.ClusterPreset("h100x8")
	if err != nil {
		panic(err)
	}
	c = c.WithNodes(nodes)
	c.GPUsPerNode = perNode
	return c
}

// fakeModel keeps compute and communication of similar size so that the
// ILP has to trade them off.
func fakeModel(experts, k int) costmodel.Model {
	return costmodel.Model{Name: "tiny", Layers: 2, Experts: experts, TopK: k, Hidden: 4096, FFN: 14336, BytesPerActivation: 2}
}

// TestJointReachesBruteForceOptimum checks that HiGHS's plan has the
// smallest ILP-model objective over every assignment, in both flows, on 1
// and 2 nodes, and that the objective is recomputed consistently.
func TestJointReachesBruteForceOptimum(t *testing.T) {
	backend := testBackend(t)
	cases := []struct {
		name          string
		nodes, per    int
		flow          costmodel.Flow
		mode          costmodel.Mode
		experts, topK int
	}{
		{"home-1node-top2", 1, 3, costmodel.FlowHome, costmodel.Sequential, 6, 2},
		{"home-2nodes-top2", 2, 2, costmodel.FlowHome, costmodel.Sequential, 8, 2},
		{"home-1node-top3-overlap", 1, 3, costmodel.FlowHome, costmodel.Overlapped, 6, 3},
		{"chain-1node-top2", 1, 3, costmodel.FlowChain, costmodel.Sequential, 6, 2},
		{"chain-2nodes-top1", 2, 1, costmodel.FlowChain, costmodel.Sequential, 6, 1},
		{"chain-2x2-top2", 2, 2, costmodel.FlowChain, costmodel.Sequential, 4, 2},
		{"chain-1node-overlap", 1, 3, costmodel.FlowChain, costmodel.Overlapped, 6, 2},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			tr := randomTrace(rng, 400, 2, tc.experts, tc.topK)
			stats := tr.Stats(routing.StatsOptions{})
			p := Problem{Stats: stats, Cluster: smallCluster(tc.nodes, tc.per), Model: fakeModel(tc.experts, tc.topK), Flow: tc.flow, Mode: tc.mode}
			res, err := Solve(context.Background(), p, StrategyJoint, backend, Options{TimeLimit: 30 * time.Second, RelGap: -1, NoPolish: true})
			require.NoError(t, err)
			require.Equal(t, StatusOptimal, res.Status)
			all := assignments(tc.experts, p.Cluster.GPUs())
			obj := func(a0, a1 []int) float64 {
				v, err := JointModelObjective(p, planOf(p.Cluster.GPUs(), a0, a1), Options{})
				require.NoError(t, err)
				return v
			}
			best := math.Inf(1)
			if tc.flow == costmodel.FlowHome {
				// Layers are independent: minimise each with the other fixed.
				b0 := all[0]
				for _, a0 := range all {
					if obj(a0, all[0]) < obj(b0, all[0]) {
						b0 = a0
					}
				}
				for _, a1 := range all {
					best = math.Min(best, obj(b0, a1))
				}
			} else {
				for _, a0 := range all {
					for _, a1 := range all {
						best = math.Min(best, obj(a0, a1))
					}
				}
			}
			// Proven optimal: HiGHS's bound is the optimum, which brute force
			// must reproduce; the returned plan (the better of the ILP's and
			// the warm start under the exact cost model) cannot beat it.
			assert.InDelta(t, best, res.Bound, 1e-9*best, "ILP optimum vs brute force")
			assert.GreaterOrEqual(t, res.ModelObjective, best*(1-1e-9))
			assert.LessOrEqual(t, res.Objective, res.BaselineObjective*(1+1e-12), "never worse than the warm start")
		})
	}
}

// TestJointCountOnlyIsExact: with expert counts only, the joint ILP's model
// is the cost model itself (up to nothing), so its objective equals
// costmodel.Evaluate's.
func TestJointCountOnlyIsExact(t *testing.T) {
	backend := testBackend(t)
	rng := rand.New(rand.NewPCG(3, 3))
	load := make([][]float64, 3)
	for l := range load {
		load[l] = make([]float64, 8)
		for e := range load[l] {
			load[l][e] = float64(100 + rng.IntN(5000))
		}
	}
	stats := routing.StatsFromLoad(load, 2)
	for _, nodes := range []int{1, 2} {
		p := Problem{Stats: stats, Cluster: smallCluster(nodes, 4/nodes), Model: fakeModel(8, 2)}
		res, err := Solve(context.Background(), p, StrategyJoint, backend, Options{TimeLimit: 20 * time.Second, RelGap: -1, NoPolish: true})
		require.NoError(t, err)
		assert.InDelta(t, res.Objective, res.ModelObjective, 1e-9*res.Objective, "nodes=%d", nodes)
	}
}

func planOf(gpus int, layers ...[]int) *placement.Plan {
	a := make([][]placement.GPU, len(layers))
	for l, as := range layers {
		for _, g := range as {
			a[l] = append(a[l], placement.GPU(g))
		}
	}
	return placement.FromAssignment(gpus, a, "test")
}

func testBackend(t testing.TB) mip.Backend {
	t.Helper()
	return highs.Backend{}
}
