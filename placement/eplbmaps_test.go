package placement

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEPLBMaps(t *testing.T) {
	// Not GPU-major: EPLBMaps reorders the slots first.
	p := &Plan{GPUs: 2, Experts: 3, Layers: []LayerPlan{
		{SlotExpert: ex(1, 2, 0, 0), SlotGPU: gp(1, 0, 0, 1)},
	}}
	m, err := p.EPLBMaps()
	require.NoError(t, err)
	assert.Equal(t, &EPLBMaps{
		Phy2Log: [][]int{{2, 0, 1, 0}},
		Log2Phy: [][][]int{{{1, 3}, {2, -1}, {0, -1}}},
		LogCnt:  [][]int{{2, 1, 1}},
	}, m)

	_, err = roundRobin(1, 5, 2).EPLBMaps()
	assert.ErrorContains(t, err, "every GPU needs the same number")

	_, err = (&Plan{GPUs: 1, Experts: 1}).EPLBMaps()
	assert.ErrorContains(t, err, "no layers")

	q := &Plan{GPUs: 2, Experts: 2, Layers: []LayerPlan{
		{SlotExpert: ex(0, 1), SlotGPU: gp(0, 1)},
		{SlotExpert: ex(0, 1, 0, 1), SlotGPU: gp(0, 0, 1, 1)},
	}}
	_, err = q.EPLBMaps()
	assert.ErrorContains(t, err, "layer 1 has 4 slots but layer 0 has 2")
	q.Layers[1] = LayerPlan{SlotExpert: ex(0, 0), SlotGPU: gp(0, 0)}
	var ve *ValidationError
	assert.ErrorAs(t, func() error { _, err := q.EPLBMaps(); return err }(), &ve)
}
