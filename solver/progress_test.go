package solver_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestProgressReportsEveryJointPath: each path of the joint strategy (the
// ILP with the exact annealing and the certified bound on one node, the
// replicated search, the affinity search) reports its stages in order of
// time, the last stage's incumbent is the cost of the returned plan, the
// "bound" stage's bound is the bound the result certifies, and every gap
// lies in [0, 1]. It catches a path that reports nothing, a report of a
// plan the solver did not return, or a bound in other units.
func TestProgressReportsEveryJointPath(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	withPaths := testkit.RandomTrace(rng, 300, 2, 8, 2).Stats(routing.StatsOptions{})
	countOnly := routing.StatsFromLoad(withPaths.Load, 2)
	for _, tc := range []struct {
		name      string
		p         Problem
		first     string
		last      string
		wantBound bool
	}{
		{"one node exact", Problem{Stats: withPaths, Cluster: testkit.SmallCluster(1, 4), Model: testkit.FakeModel(8, 2)}, "baseline ", "anneal", true},
		{"replicas", Problem{Stats: countOnly, Cluster: testkit.SmallCluster(1, 4), Model: testkit.FakeModel(8, 2), RedundantSlots: 4}, "replicas", "replicas", false},
		{"affinity", Problem{Stats: withPaths, Cluster: testkit.SmallCluster(2, 2), Model: testkit.FakeModel(8, 2), RedundantSlots: 4}, "packing", "affinity", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []Progress
			res, err := Solve(context.Background(), tc.p, Options{Strategy: StrategyJoint, Effort: 1, Progress: func(pr Progress) { got = append(got, pr) }})
			require.NoError(t, err)
			require.NotEmpty(t, got)
			assert.Contains(t, got[0].Stage, tc.first)
			last := got[len(got)-1]
			if last.Stage == "bound" && len(got) > 1 {
				last = got[len(got)-2]
			}
			assert.Equal(t, tc.last, last.Stage)
			assert.InDelta(t, res.Objective, last.Objective, 1e-12*res.Objective, "the last incumbent is the returned plan's cost")
			sawBound := false
			for i, pr := range got {
				if i > 0 {
					assert.GreaterOrEqual(t, pr.Elapsed, got[i-1].Elapsed)
				}
				assert.Positive(t, pr.Objective, pr.Stage)
				assert.Equal(t, pr.Stage == "ilp" || pr.Stage == "descent", pr.ILPModel, pr.Stage)
				if g := pr.Gap(); !math.IsNaN(g) {
					assert.True(t, g >= 0 && (g <= 1 || !pr.ILPModel), "%s: gap %v", pr.Stage, g)
				}
				if pr.Stage == "bound" {
					sawBound = true
					assert.InDelta(t, res.CostBound, pr.Bound, 1e-12*res.CostBound, "the reported bound is the certified one")
					assert.InDelta(t, res.CostGap, pr.Gap(), 1e-9, "the gap as Result states it")
					assert.LessOrEqual(t, pr.Bound, pr.Objective*(1+1e-12))
				}
			}
			assert.Equal(t, tc.wantBound, sawBound)
		})
	}
	// No listener, no reports and no difference in the plan.
	p := Problem{Stats: countOnly, Cluster: testkit.SmallCluster(1, 4), Model: testkit.FakeModel(8, 2), RedundantSlots: 4}
	a, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	b, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 1, Progress: func(Progress) {}})
	require.NoError(t, err)
	assert.Equal(t, a.Plan, b.Plan)
}

// TestProgressGap: the gap is Result.Gap's on the ILP model and
// Result.CostGap's on the exact cost model, never negative, and NaN
// without a bound or a positive incumbent.
func TestProgressGap(t *testing.T) {
	nan := math.NaN()
	assert.InDelta(t, 0.2, Progress{Objective: 10, Bound: 8, ILPModel: true}.Gap(), 1e-15)
	assert.InDelta(t, 0.25, Progress{Objective: 10, Bound: 8}.Gap(), 1e-15)
	assert.Equal(t, 0.0, Progress{Objective: 10, Bound: 11}.Gap())
	assert.Equal(t, 0.0, Progress{Objective: 10, Bound: 11, ILPModel: true}.Gap())
	assert.Equal(t, 1.0, Progress{Objective: 10, Bound: 0, ILPModel: true}.Gap())
	assert.True(t, math.IsNaN(Progress{Objective: 10, Bound: 0}.Gap()))
	assert.True(t, math.IsNaN(Progress{Objective: 10, Bound: nan}.Gap()))
	assert.True(t, math.IsNaN(Progress{Objective: 0, Bound: 0}.Gap()))
	assert.True(t, math.IsNaN(Progress{Objective: nan, Bound: 1}.Gap()))
}
