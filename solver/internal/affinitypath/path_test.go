package affinitypath

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestSameCopies compares plans by where every expert's copies are, not by
// the order of their slots.
func TestSameCopies(t *testing.T) {
	a := placement.FromReplicas(4, [][][]placement.GPU{{{0, 1}, {2}, {3}, {1}}}, "a")
	b := placement.FromReplicas(4, [][][]placement.GPU{{{1, 0}, {2}, {3}, {1}}}, "b")
	c := placement.FromReplicas(4, [][][]placement.GPU{{{0, 2}, {1}, {3}, {1}}}, "c")
	assert.True(t, placement.SameCopies(a, b), "the same copies in another order")
	assert.False(t, placement.SameCopies(a, c), "a copy moved")
	assert.False(t, placement.SameCopies(a, testkit.PlanOf(4, []int{0, 1, 2, 3})), "a copy fewer")
}

// TestNodeSpeedPeak is 1 on equal GPUs and the fastest node's share of the
// speed times the nodes otherwise.
func TestNodeSpeedPeak(t *testing.T) {
	c := testkit.SmallCluster(2, 2)
	assert.InDelta(t, 1.0, nodeSpeedPeak(c), 1e-12)
	c.Speed = []float64{2, 2, 1, 1}
	assert.InDelta(t, 4.0/6*2, nodeSpeedPeak(c), 1e-12)
}

// TestWithinMoves bounds the changed slots per layer only with a running
// plan and a positive MaxMoves.
func TestWithinMoves(t *testing.T) {
	cur := testkit.PlanOf(2, []int{0, 0, 1, 1})
	next := testkit.PlanOf(2, []int{1, 0, 0, 1})
	var p Problem
	assert.True(t, withinMoves(p, next), "no running plan")
	p.Current = cur
	assert.True(t, withinMoves(p, next), "no bound")
	n := placement.ChangedSlots(cur.Layers[0], next.Layers[0])
	p.MaxMoves = n
	assert.True(t, withinMoves(p, next))
	p.MaxMoves = n - 1
	assert.False(t, withinMoves(p, next))
}
