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
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

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
			tr := testkit.RandomTrace(rng, 400, 2, tc.experts, tc.topK)
			stats := tr.Stats(routing.StatsOptions{})
			p := Problem{Stats: stats, Cluster: testkit.SmallCluster(tc.nodes, tc.per), Model: testkit.FakeModel(tc.experts, tc.topK), Flow: tc.flow, Mode: tc.mode}
			res, err := Solve(context.Background(), p, StrategyJoint, backend, Options{TimeLimit: 30 * time.Second, RelGap: -1, NoPolish: true})
			require.NoError(t, err)
			require.Equal(t, StatusOptimal, res.Status)
			all := testkit.Assignments(tc.experts, p.Cluster.GPUs())
			obj := func(a0, a1 []int) float64 {
				v, err := JointModelObjective(p, testkit.PlanOf(p.Cluster.GPUs(), a0, a1), Options{})
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
		p := Problem{Stats: stats, Cluster: testkit.SmallCluster(nodes, 4/nodes), Model: testkit.FakeModel(8, 2)}
		res, err := Solve(context.Background(), p, StrategyJoint, backend, Options{TimeLimit: 20 * time.Second, RelGap: -1, NoPolish: true})
		require.NoError(t, err)
		assert.InDelta(t, res.Objective, res.ModelObjective, 1e-9*res.Objective, "nodes=%d", nodes)
	}
}

func testBackend(t testing.TB) mip.Backend {
	t.Helper()
	return highs.Backend{}
}
