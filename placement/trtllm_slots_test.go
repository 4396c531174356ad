package placement

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadTRTLLMSlots reads a load-balancer YAML in TensorRT-LLM's slot
// order, keeping two copies of one expert on one rank as two slots (the
// Plan merges them), with no GPU count needed.
func TestReadTRTLLMSlots(t *testing.T) {
	doc := "num_slots: 4\ninitial_global_assignments:\n  5: [2, 1, 0, 2]\n  3: [0, 0, 1, 2]\nlayer_updates_per_iter: 0\n"
	layers, slots, err := ReadTRTLLMSlots(strings.NewReader(doc))
	require.NoError(t, err)
	assert.Equal(t, []int{3, 5}, layers)
	assert.Equal(t, [][]int{{0, 0, 1, 2}, {2, 1, 0, 2}}, slots)
	p, err := ReadWith(strings.NewReader(doc), FormatTRTLLM, Layout{GPUs: 2})
	require.NoError(t, err)
	assert.Equal(t, 3, p.Slots(0), "the plan merges the two copies on rank 0")

	for _, tc := range []struct{ doc, msg string }{
		{"num_slots: 4\ninitial_global_assignments:\n  3: [0, 1, 2]\n", "initial_global_assignments[3] has 3 entries, want num_slots 4"},
		{"num_slots: 2\ninitial_global_assignments:\n  3: [0, -1]\n", "initial_global_assignments[3][1] is -1"},
		{"num_slots: 2\nep_sizes: 2\ninitial_global_assignments:\n  3: [0, 1]\n", "field ep_sizes not found"},
		{"num_slots: 0\ninitial_global_assignments:\n  3: []\n", "num_slots"},
	} {
		_, _, err := ReadTRTLLMSlots(strings.NewReader(tc.doc))
		require.Error(t, err, tc.doc)
		assert.Contains(t, err.Error(), tc.msg)
	}
}
