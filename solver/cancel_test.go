package solver_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	. "github.com/moetuner/moetuner/solver"
)

// Cancelling a joint solve on the one-node home flow stops the annealing
// and the bound too, not only HiGHS, and returns the best plan found by
// then: the solve ends long before its time limit with a valid plan and
// StatusStopped. With a 20 s limit the ILP ends at 0.4 s and the polish at
// 0.6 s (budget.go); the annealing runs to 5 s, so a cancel at 2 s lands in
// it. A solve that ignored the cancel would take 20 s; one that gave up
// its plan would return an error.
func TestHomeJointHonoursCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("solves FLAME")
	}
	p := flameProblem(t, 1, costmodel.FlowHome)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(2 * time.Second)
		cancel()
	}()
	start := time.Now()
	res, err := Solve(ctx, p, Options{Strategy: StrategyJoint, TimeLimit: 20 * time.Second})
	took := time.Since(start)
	t.Logf("cancelled after 2 s, returned after %v", took.Round(time.Millisecond))
	assert.Less(t, took, 6*time.Second)
	require.NoError(t, err)
	verify(t, p, res)
	assert.Equal(t, StatusStopped, res.Status)
	assert.Less(t, res.Objective, res.BaselineObjective, "the polish before the cancel already beat the baseline")
}
