package placement

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
)

func ex(xs ...int) []routing.Expert {
	out := make([]routing.Expert, len(xs))
	for i, x := range xs {
		out[i] = routing.Expert(x)
	}
	return out
}

func gp(xs ...int) []GPU {
	out := make([]GPU, len(xs))
	for i, x := range xs {
		out[i] = GPU(x)
	}
	return out
}

// replicated is a small plan with a replicated expert and slots that are
// not GPU-major in layer 1.
func replicated() *Plan {
	return &Plan{
		GPUs: 2, Experts: 3, Strategy: "test",
		Layers: []LayerPlan{
			{SlotExpert: ex(0, 1, 2, 0), SlotGPU: gp(0, 0, 1, 1)},
			{SlotExpert: ex(1, 2, 0, 1), SlotGPU: gp(1, 0, 0, 0)},
		},
	}
}

func TestPlanAccessors(t *testing.T) {
	p := replicated()
	require.NoError(t, p.Validate(ValidateOptions{}))
	assert.Equal(t, p.Layers[1], p.Layer(1))
	assert.Equal(t, 4, p.Slots(0))
	assert.Equal(t, [][]GPU{gp(0, 1), gp(0), gp(1)}, p.ExpertGPUs(0))
	assert.Equal(t, [][]GPU{gp(0), gp(0, 1), gp(0)}, p.ExpertGPUs(1))
	assert.Equal(t, gp(-1, 0, 1), p.Assignment(0))
	assert.Equal(t, gp(0, -1, 0), p.Assignment(1))
	assert.Equal(t, []int{2, 2}, p.SlotsPerGPU(0))
	assert.Equal(t, []int{3, 1}, p.SlotsPerGPU(1))
	assert.False(t, p.IsGPUMajor())

	q := p.GPUMajor()
	assert.True(t, q.IsGPUMajor())
	assert.Equal(t, p.Layers[0], q.Layers[0])
	assert.Equal(t, LayerPlan{SlotExpert: ex(2, 0, 1, 1), SlotGPU: gp(0, 0, 0, 1)}, q.Layers[1])
	assert.Equal(t, p.ExpertGPUs(1), q.ExpertGPUs(1))
	assert.Equal(t, ex(1, 2, 0, 1), p.Layers[1].SlotExpert, "GPUMajor must not modify its receiver")
}

func TestCloneEqual(t *testing.T) {
	p := replicated()
	p.Meta = map[string]string{"flow": "ep"}
	q := p.Clone()
	require.True(t, p.Equal(q))
	q.Layers[0].SlotGPU[0] = 1
	assert.False(t, p.Equal(q))
	assert.Equal(t, GPU(0), p.Layers[0].SlotGPU[0], "Clone must copy slices")
	q = p.Clone()
	q.Meta["flow"] = "other"
	assert.False(t, p.Equal(q))
	assert.Equal(t, "ep", p.Meta["flow"], "Clone must copy Meta")

	var nilPlan *Plan
	assert.True(t, nilPlan.Equal(nil))
	assert.False(t, nilPlan.Equal(p))
	assert.False(t, p.Equal(nil))
	assert.Nil(t, nilPlan.Clone())

	a := &Plan{GPUs: 1, Experts: 1, Layers: []LayerPlan{{SlotExpert: ex(0), SlotGPU: gp(0)}}}
	b := a.Clone()
	b.Meta = map[string]string{}
	assert.True(t, a.Equal(b), "nil and empty Meta are equal")
	b.Strategy = "x"
	assert.False(t, a.Equal(b))
}

func TestFromAssignment(t *testing.T) {
	p := FromAssignment(2, [][]GPU{gp(1, 0, 1, 0), gp(0, 0, 1, 1)}, "x")
	require.NoError(t, p.Validate(ValidateOptions{EqualSlots: true}))
	assert.Equal(t, 4, p.Experts)
	assert.Equal(t, "x", p.Strategy)
	assert.Equal(t, LayerPlan{SlotExpert: ex(1, 3, 0, 2), SlotGPU: gp(0, 0, 1, 1)}, p.Layers[0])
	assert.Equal(t, LayerPlan{SlotExpert: ex(0, 1, 2, 3), SlotGPU: gp(0, 0, 1, 1)}, p.Layers[1])
	for l := range p.Layers {
		for s, g := range p.Layers[l].SlotGPU {
			assert.Equal(t, GPU(s/2), g, "slot %d on GPU s/(P/G)", s)
		}
	}
	assert.Equal(t, gp(1, 0, 1, 0), p.Assignment(0))

	empty := FromAssignment(3, nil, "none")
	assert.Equal(t, 0, empty.Experts)
	assert.Empty(t, empty.Layers)

	r := FromReplicas(2, [][][]GPU{{gp(1, 0), gp(1)}}, "rep")
	assert.Equal(t, LayerPlan{SlotExpert: ex(0, 0, 1), SlotGPU: gp(0, 1, 1)}, r.Layers[0])
	require.NoError(t, r.Validate(ValidateOptions{}))
}
