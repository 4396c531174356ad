package solvertest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solvertest"
)

func TestEmbeddedData(t *testing.T) {
	f := solvertest.FLAMEStats()
	assert.Equal(t, 8, f.Layers)
	assert.Equal(t, 64, f.Experts)
	assert.Equal(t, 6, f.TopK)
	assert.Equal(t, 1024.0, f.Tokens)
	assert.NotNil(t, f.Patterns)
	assert.NotNil(t, f.Transitions)
	m := solvertest.MixtralStats()
	assert.Equal(t, 32, m.Layers)
	assert.Equal(t, 2, m.TopK)
	assert.Equal(t, 105566.0, m.Tokens)
	f.Load[0][0] = -1
	assert.NotEqual(t, -1.0, solvertest.FLAMEStats().Load[0][0], "each call is a fresh copy")
}

// Check accepts real results and catches each kind of broken one: a
// tampered objective, a plan with an expert left out, two copies on one
// GPU, a bound above its objective.
func TestCheck(t *testing.T) {
	p := solvertest.Mixtral()
	res, err := solver.Solve(context.Background(), p, solver.Options{Effort: 1})
	require.NoError(t, err)
	require.NoError(t, solvertest.Check(p, res))
	base := solvertest.Baseline(t, p, solver.StrategyContiguous)

	bad := *res
	bad.Objective *= 0.99
	assert.ErrorContains(t, solvertest.Check(p, &bad), "but the cost model gives")

	bad = *res
	bad.Bound = bad.ModelObjective * 1.01
	assert.ErrorContains(t, solvertest.Check(p, &bad), "Bound")

	bad = *res
	bad.Plan = res.Plan.Clone()
	bad.Plan.Layers[3].SlotExpert[0] = bad.Plan.Layers[3].SlotExpert[1]
	assert.ErrorContains(t, solvertest.Check(p, &bad), "invalid plan")

	bad = *base
	bad.CostBound = base.Objective * 2
	assert.ErrorContains(t, solvertest.Check(p, &bad), "CostBound")

	q := solvertest.FLAME(2, 4, costmodel.FlowChain)
	assert.ErrorContains(t, solvertest.Check(q, res), "plan has")
}
