package solver_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/moetuner/moetuner/costmodel"
	. "github.com/moetuner/moetuner/solver"
)

// Cancelling a joint solve on the one-node home flow stops the annealing
// and the bound too, not only HiGHS: the solve ends long before its time
// limit.
func TestHomeJointHonoursCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("solves FLAME")
	}
	p := flameProblem(t, 1, costmodel.FlowHome)
	ctx, cancel := context.WithCancel(context.Background())
	// With a 20 s limit the ILP ends at 2 s and the polish at 3 s; the
	// annealing runs to 6 s, so a cancel at 4.5 s lands in it.
	go func() {
		time.Sleep(4500 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	res, err := Solve(ctx, p, StrategyJoint, testBackend(t), Options{TimeLimit: 20 * time.Second})
	took := time.Since(start)
	t.Logf("cancelled after 4.5 s, returned after %v (err %v)", took.Round(time.Millisecond), err)
	assert.Less(t, took, 12*time.Second)
	if err == nil {
		verify(t, p, res)
	}
}
