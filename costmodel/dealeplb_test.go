package costmodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// stackPlan is one layer of 3 experts on 2 GPUs (2 slots each): expert 0
// on both GPUs, listed in replica order GPU 1 first.
func stackPlan() *placement.Plan {
	return &placement.Plan{GPUs: 2, Experts: 3, Layers: []placement.LayerPlan{{
		SlotExpert: []routing.Expert{0, 1, 2, 0}, SlotGPU: []placement.GPU{0, 0, 1, 1}}},
		StackEPLB: &placement.StackEPLB{Log2Phy: [][][]int32{{{3, 0}, {1}, {2}}}, Unrouted: [][]int32{{0, 3}, {1}, {2}}}}
}

// TestStackEPLBSplitErrors: a record that does not match the plan is
// refused, naming the field; dense rows need Unrouted.
func TestStackEPLBSplitErrors(t *testing.T) {
	d := placement.DispatchSGLangStaticNarrow
	_, err := NewSplitter(d, stackPlan(), 2, 1, placement.Layout{})
	require.NoError(t, err)
	_, err = NewSplitter(d, stackPlan(), 2, 1, placement.Layout{GPUs: 2, Experts: 3, ModelLayers: 2, LayerIDs: []int{1}})
	require.NoError(t, err)

	p := stackPlan()
	p.StackEPLB.Log2Phy[0][1] = []int32{2}
	_, err = NewSplitter(d, p, 2, 1, placement.Layout{})
	assert.ErrorContains(t, err, "Plan.StackEPLB.Log2Phy[0][1] names slot 2")

	p = stackPlan()
	p.StackEPLB.Log2Phy[0][0] = []int32{3}
	_, err = NewSplitter(d, p, 2, 1, placement.Layout{})
	assert.ErrorContains(t, err, "Plan.StackEPLB.Log2Phy[0] lists 3 slots, the layer has 4")

	p = stackPlan()
	p.StackEPLB.Unrouted = nil
	_, err = NewSplitter(d, p, 2, 1, placement.Layout{GPUs: 2, Experts: 3, ModelLayers: 2, LayerIDs: []int{1}})
	assert.ErrorContains(t, err, "Plan.StackEPLB.Unrouted")

	p = stackPlan()
	p.StackEPLB.Log2Phy = nil
	_, err = NewSplitter(d, p, 2, 1, placement.Layout{})
	assert.ErrorContains(t, err, "Plan.StackEPLB.Log2Phy has 0 layers, the plan 1")
}

// TestStackEPLBSplitOtherCopies: the bound plan's copies are exact; other
// copies of an expert get the deal's expectation, reported as not exact.
func TestStackEPLBSplitOtherCopies(t *testing.T) {
	sp, err := NewSplitter(placement.DispatchSGLangStatic, stackPlan(), 2, 1, placement.Layout{})
	require.NoError(t, err)
	frac := make([]float64, 4)
	assert.True(t, sp.Split(0, 0, []int32{1, 0}, []int32{1, 1}, frac))
	// Every rank keeps its own copy (both GPUs hold one).
	assert.Equal(t, []float64{0, 1, 1, 0}, frac)
	frac = make([]float64, 2)
	assert.True(t, sp.Split(0, 1, []int32{0}, []int32{1}, frac))
	assert.Equal(t, []float64{1, 1}, frac)
	frac = make([]float64, 2)
	assert.False(t, sp.Split(0, 1, []int32{1}, []int32{1}, frac), "expert 1 moved to GPU 1: no longer the algorithm's plan")
	assert.Equal(t, []float64{1, 1}, frac)
}
