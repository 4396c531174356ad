package solver_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestJointBalancesAsDealt: under SGLang's static table joint balances the
// loads as SGLang deals them. On a small planted instance (2 nodes × 4
// GPUs, 8 redundant slots, per-rank token mixes) its busiest/mean as dealt
// meets the dispatch issue's in-sample target (1.02 averaged over layers)
// and beats EPLB's, while the same search planning with the deal's
// expectation (static-mean, as moetuner did before it modeled the deal)
// misses the target once scored as dealt. The statistics keep every
// token's path and no per-source loads, so the search plans on the trace's
// own mix (no shrinking). A work budget (Effort) makes the solves
// reproducible on a busy machine. With 1,500 tokens a rank's share of an
// expert is a few dozen tokens, so where the deal sends it matters: with
// 3,000 the search planned on the expectation came within 0.0002 of the
// target (4 seeds: 1.020-1.035 at 3,000 tokens, 1.021-1.036 at 1,500;
// joint as dealt 1.002-1.004 on all eight).
func TestJointBalancesAsDealt(t *testing.T) {
	pl := testkit.Planted{Nodes: 2, GPUsPerNode: 4, SlotsPerGPU: 4, Layers: 3, TopK: 4, Tokens: 1500, Stray: 2, Skew: 0.8}
	tr, _ := pl.Trace(rand.New(rand.NewPCG(0, 11)))
	require.NoError(t, tr.Validate())
	st := tr.Stats(routing.StatsOptions{PathError: -1})
	require.True(t, st.HasSources())
	st.SourceLoad = nil
	p := Problem{Stats: st, Cluster: testkit.SmallCluster(2, 4), Model: testkit.FakeModel(32, 4), Flow: costmodel.FlowHome, RedundantSlots: 8}
	asDealt := func(plan *placement.Plan) float64 {
		q := p
		q.Dispatch = placement.DispatchSGLangStatic
		rep, err := q.Scenario().Evaluate(plan)
		require.NoError(t, err)
		return rep.MeanBalance
	}
	solve := func(d placement.Dispatch, st Strategy) float64 {
		q := p
		q.Dispatch = d
		res, err := Solve(context.Background(), q, Options{Strategy: st, Effort: 1})
		require.NoError(t, err)
		verify(t, q, res)
		return asDealt(res.Plan)
	}
	dealt, mean := solve(placement.DispatchSGLangStatic, StrategyJoint), solve(placement.DispatchStaticMean, StrategyJoint)
	eplb := solve(placement.DispatchSGLangStatic, StrategyEPLB)
	t.Logf("busiest/mean as dealt: joint %.4f, joint planned on the expectation %.4f, EPLB %.4f", dealt, mean, eplb)
	assert.LessOrEqual(t, dealt, 1.02, "joint as dealt meets the in-sample target")
	assert.Greater(t, mean, 1.02, "planned on the expectation, the same search misses it")
	assert.Less(t, dealt, eplb)
}

// TestJointCountsPolishedAsDealt: with per-expert counts only (no token
// paths, no sources: every rank sends an equal share) under SGLang's plain
// table, joint's plan is polished on the table as dealt (the replica
// solver plans on its expectation, which no GPU sees): the polished plan
// is modeled faster than the same solve unpolished, both scored as dealt.
// Without the polish for count-only statistics the two are the same plan.
func TestJointCountsPolishedAsDealt(t *testing.T) {
	better := 0
	for seed := range uint64(4) {
		pl := testkit.Planted{Nodes: 2, GPUsPerNode: 4, SlotsPerGPU: 4, Layers: 3, TopK: 4, Tokens: 3000, Stray: 2, Skew: 0.8}
		tr, _ := pl.Trace(rand.New(rand.NewPCG(seed, 13)))
		st := tr.Stats(routing.StatsOptions{PathError: -1})
		st.Patterns, st.SourceLoad, st.Transitions = nil, nil, nil
		p := Problem{Stats: st, Cluster: testkit.SmallCluster(2, 4), Model: testkit.FakeModel(32, 4), Flow: costmodel.FlowHome,
			RedundantSlots: 8, Dispatch: placement.DispatchSGLangStatic}
		solve := func(noPolish bool) float64 {
			res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 1, NoPolish: noPolish})
			require.NoError(t, err)
			verify(t, p, res)
			return res.Report.TimeSec
		}
		polished, plain := solve(false), solve(true)
		t.Logf("seed %d: modeled %.6g s polished, %.6g s not", seed, polished, plain)
		assert.LessOrEqual(t, polished, plain*(1+1e-12))
		if polished < plain*(1-1e-9) {
			better++
		}
	}
	assert.Greater(t, better, 1, "the polish must price the deal and improve on its expectation")
}
